"""open-instruct's IFEvalG instruction ids beyond IFEval's (the `verifiable-instructions` package
NeMo-Gym's instruction_following server checks rows with carries the same ones).

Same ids, kwargs names and verdicts as the reference, with two deliberate differences kept across
this environment: keywords are matched literally (the reference compiles them as regexes, so a row
could inject a pathological one), and a missing kwarg is a 400 where the reference draws a random
value. Sentences are split with IFEval's regex splitter, as the reference does; `word_tokenize`
is NLTK's Treebank tokenizer on the punkt stand-in's sentences (text.py).
"""
from __future__ import annotations

import re
from typing import Any

from .args import Check, Spec, compare, first_string, integer, relation, string
from .text import nltk_words, split_sentences_ifeval_regex

_LOWER_WORD = re.compile(r"\b[a-z]+\b")
_LETTER = re.compile(r"[a-zA-Z]")
_DIVIDER = re.compile(r"\s?\*\*\*\s?")
_NOT_WORD = re.compile(r"[^\w\s]")
_ASTERISKS = "******"


def _count(keyword: str, text: str) -> int:
    """Case-insensitive occurrences (the reference's `re.findall(keyword, text, re.IGNORECASE)`)."""
    return len(re.findall(re.escape(keyword), text, re.IGNORECASE))


def _paragraph_count(paragraphs: list[str]) -> int | None:
    """Paragraphs once an empty first or last one is dropped; None when an inner one is empty."""
    count = len(paragraphs)
    for index, paragraph in enumerate(paragraphs):
        if not paragraph.strip():
            if index in (0, len(paragraphs) - 1):
                count -= 1
            else:
                return None
    return count


def _same(a: str, b: str) -> bool:
    return a.strip().lower() == b.strip().lower()


# ----------------------------------------------------------------------------- copying
def _copy(iid: str, kw: dict[str, Any]) -> Check:
    prompt = string(iid, kw, "prompt_to_repeat")
    return lambda t: _same(t, prompt)


def _copy_span_idx(iid: str, kw: dict[str, Any]) -> Check:
    prompt = string(iid, kw, "prompt_to_repeat")
    start, end = integer(iid, kw, "n_start"), integer(iid, kw, "n_end")
    return lambda t: _same(t, prompt[start:end])  # the end index is exclusive here (IFBench's is inclusive)


def _copying_multiple(iid: str, kw: dict[str, Any]) -> Check:
    prompt, n = string(iid, kw, "prompt_to_repeat"), integer(iid, kw, "N", 1)

    def check(t: str) -> bool:
        copies = t.split(_ASTERISKS)
        return len(copies) == n and all(_same(copy, prompt) for copy in copies)
    return check


def _repeat_phrase(iid: str, kw: dict[str, Any]) -> Check:
    phrase = string(iid, kw, "phrase").strip().split()
    n = integer(iid, kw, "small_n", 1)
    first, last = phrase[0], phrase[-1]

    def found(t: str) -> list[str]:
        """`re.findall(f"{first} .*? {last}", t)` in linear time: a line with no ` {last}` after a
        candidate start cannot match from any later start on it either."""
        head, tail, matches, pos = first + " ", " " + last, [], 0
        while (start := t.find(head, pos)) != -1:
            line_end = t.find("\n", start)
            line_end = len(t) if line_end == -1 else line_end
            end = t.find(tail, start + len(head), line_end)
            if end == -1:
                pos = line_end + 1
                continue
            matches.append(t[start:end + len(tail)])
            pos = end + len(tail)
        return matches

    def check(t: str) -> bool:
        phrases = found(t)
        if len(phrases) != n:
            return False
        differences = 0
        for words in (p.split() for p in phrases):
            if len(words) != len(phrase):
                return False
            differences = sum(a != b for a, b in zip(words, phrase))
            if differences > 1:
                return False
        return differences == 1  # the reference looks at the last phrase's count only
    return check


# ----------------------------------------------------------------------------- words
def _word_once(iid: str, kw: dict[str, Any]) -> Check:
    keyword = string(iid, kw, "keyword").strip()
    return lambda t: _count(keyword, t) == 1


def _word_count_different_numbers(iid: str, kw: dict[str, Any]) -> Check:
    keyword = string(iid, kw, "keyword").strip()
    n, rel = integer(iid, kw, "frequency"), relation(iid, kw, "relation")
    return lambda t: compare(_count(keyword, t), rel, n)


def _count_increment_word(iid: str, kw: dict[str, Any]) -> Check:
    once, twice = string(iid, kw, "keyword1").strip(), string(iid, kw, "keyword2").strip()
    return lambda t: _count(once, t) == 1 and _count(twice, t) == 2


def _exclude_word_harder(iid: str, kw: dict[str, Any]) -> Check:
    keyword = string(iid, kw, "keyword").strip()
    return lambda t: f" {keyword} " not in t


def _no_adjacent_consecutive(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        initials = [word[0].lower() for word in t.split()]
        return not any(ord(b) - ord(a) == 1 for a, b in zip(initials, initials[1:]))
    return check


def _palindrome(iid: str, kw: dict[str, Any]) -> Check:
    return lambda t: any(word == word[::-1] for word in t.split())


def _keyword_specific_position(iid: str, kw: dict[str, Any]) -> Check:
    keyword = first_string(iid, kw, "keyword").strip()
    n, m = integer(iid, kw, "n", 1), integer(iid, kw, "m", 1)

    def check(t: str) -> bool:
        sentences = split_sentences_ifeval_regex(t)
        if len(sentences) < n:
            return False
        words = nltk_words(sentences[n - 1])
        return len(words) >= m and words[m - 1] == keyword  # case-sensitive, as the reference
    return check


def _start_end(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        words = nltk_words(t)
        return len(words) >= 2 and words[0].lower() == words[-1].lower()
    return check


def _count_unique(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        words = nltk_words(t)
        return len(words) == len(set(words))
    return check


def _lowercase_counting(iid: str, kw: dict[str, Any]) -> Check:
    n = integer(iid, kw, "N", minimum=1)  # every lowercase word counts, repeated or not
    return lambda t: len(_LOWER_WORD.findall(t)) <= n


def _letter_counting(iid: str, kw: dict[str, Any]) -> Check:
    n, rel = integer(iid, kw, "N", minimum=1), relation(iid, kw, "relation")
    return lambda t: compare(len(_LETTER.findall(t)), rel, n)


# ----------------------------------------------------------------------------- first and last words
def _first_word_sent(iid: str, kw: dict[str, Any]) -> Check:
    word = string(iid, kw, "first_word").strip().lower()  # the reference fails on a list here (a typo)

    def check(t: str) -> bool:
        return all(s.strip() and s.split()[0].lower() == word for s in split_sentences_ifeval_regex(t))
    return check


def _first_word_answer(iid: str, kw: dict[str, Any]) -> Check:
    word = string(iid, kw, "first_word").strip().lower()
    return lambda t: bool(t.split()) and t.split()[0].lower() == word


def _last_word(sentence: str) -> str:
    return _NOT_WORD.sub("", sentence.split()[-1]).lower()


def _last_word_sent(iid: str, kw: dict[str, Any]) -> Check:
    word = first_string(iid, kw, "last_word").strip().lower()

    def check(t: str) -> bool:
        return all(s.strip() and _last_word(s) == word for s in split_sentences_ifeval_regex(t))
    return check


def _last_word_answer(iid: str, kw: dict[str, Any]) -> Check:
    word = string(iid, kw, "last_word").strip().lower()
    return lambda t: bool(t.split()) and _last_word(t) == word


# ----------------------------------------------------------------------------- format
def _sentence_hyphens(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        gold = split_sentences_ifeval_regex(t.replace("-", " "))
        return all(part.strip() == part and part == sentence for part, sentence in zip(t.split("-"), gold))
    return check


def _square_brackets(iid: str, kw: dict[str, Any]) -> Check:
    return lambda t: all(word.startswith("[") and word.endswith("]") for word in t.split())


def _bigram_wrapping(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        words = t.split()
        return all(words[i].startswith("<<") and words[i + 1].endswith(">>") for i in range(0, len(words) - 1, 2))
    return check


def _paragraphs(divider: re.Pattern[str]) -> Any:
    def build(iid: str, kw: dict[str, Any]) -> Check:
        return lambda t: _paragraph_count(divider.split(t)) == 2
    return build


def _counting_composition(iid: str, kw: dict[str, Any]) -> Check:
    n_sent, n_words = integer(iid, kw, "n_sent", 1), integer(iid, kw, "n_words", 1)

    def check(t: str) -> bool:
        paragraphs = _DIVIDER.split(t)
        if _paragraph_count(paragraphs) is None:
            return False
        for paragraph in paragraphs:  # an empty first or last paragraph has 0 sentences: it fails too
            sentences = split_sentences_ifeval_regex(paragraph)
            if len(sentences) != n_sent or any(len(nltk_words(s)) != n_words for s in sentences):
                return False
        return _paragraph_count(paragraphs) == 3
    return check


def _no_character(char: str) -> Any:
    def build(iid: str, kw: dict[str, Any]) -> Check:
        return lambda t: char not in t
    return build


REGISTRY: dict[str, Spec] = {
    "copy:repeat_phrase": Spec(_repeat_phrase),
    "copy:copy": Spec(_copy),
    "new:copy_span_idx": Spec(_copy_span_idx),
    "detectable_format:sentence_hyphens": Spec(_sentence_hyphens),
    "keywords:no_adjacent_consecutive": Spec(_no_adjacent_consecutive),
    "detectable_format:square_brackets": Spec(_square_brackets),
    "keywords:word_once": Spec(_word_once),
    "keywords:word_count_different_numbers": Spec(_word_count_different_numbers),
    "keywords:exclude_word_harder": Spec(_exclude_word_harder),
    "paragraphs:paragraphs": Spec(_paragraphs(_DIVIDER)),
    "paragraphs:paragraphs2": Spec(_paragraphs(re.compile(r"\n\n"))),
    "first_word:first_word_sent": Spec(_first_word_sent),
    "first_word:first_word_answer": Spec(_first_word_answer),
    "last_word:last_word_sent": Spec(_last_word_sent),
    "last_word:last_word_answer": Spec(_last_word_answer),
    "detectable_format:bigram_wrapping": Spec(_bigram_wrapping),
    "copy:copying_simple": Spec(_copy),
    "copy:copying_multiple": Spec(_copying_multiple),
    "punctuation:punctuation_dot": Spec(_no_character(".")),
    "punctuation:punctuation_exclamation": Spec(_no_character("!")),
    "count:lowercase_counting": Spec(_lowercase_counting),
    "letters:letter_counting": Spec(_letter_counting),
    "count:counting_composition": Spec(_counting_composition, slow=True),
    "count:count_unique": Spec(_count_unique, slow=True),
    "count:count_increment_word": Spec(_count_increment_word),
    "keywords:palindrome": Spec(_palindrome),
    "keywords:keyword_specific_position": Spec(_keyword_specific_position, slow=True),
    "keywords:start_end": Spec(_start_end, slow=True),
}
