"""IFBench's word and sentence instructions (`words:*`, `sentence:*`), with IFBench's kwargs and verdicts.

Sentences are split with the punkt stand-in (text.py), `word_tokenize` is NLTK's Treebank tokenizer
and syllables are counted with `syllapy`, as IFBench does. `words:start_verb` needs NLTK's
part-of-speech tagger model, downloaded data a server here cannot fetch: it is listed in
UNSUPPORTED and a row with it is a 400.
"""
from __future__ import annotations

import re
import string as _string
from collections import Counter
from typing import Any

from .args import Check, Spec, integer, string
from .text import PUNCTUATION, nltk_words, split_sentences, strip_punctuation

UNSUPPORTED = {
    "words:start_verb": "IFBench tags the first word with NLTK's averaged_perceptron_tagger_eng model, "
                        "downloaded data that is not available offline",
}
_EDGE = PUNCTUATION + " "
_PRIMES = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97}
_CONSONANTS = set("bcdfghjklmnpqrstvwxyz")


def _alphabet(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        words = strip_punctuation(t).strip(_EDGE).split()
        if not words or words[0][0].lower() not in _string.ascii_lowercase:
            return False
        letter = words[0][0].lower()
        for word in words[1:]:
            word = word.strip(_EDGE).lower()
            if word:
                letter = chr((ord(letter) - ord("a") + 1) % 26 + ord("a"))
                if word[0] != letter:
                    return False
        return True
    return check


def _vowel(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        lines = t.strip().split("\n")
        return len(lines) == 1 and len(set(lines[0].lower()) & set("aeiou")) <= 3
    return check


def _consonants(iid: str, kw: dict[str, Any]) -> Check:
    def has_cluster(word: str) -> bool:
        return any(a in _CONSONANTS and b in _CONSONANTS for a, b in zip(word, word[1:]))
    return lambda t: all(has_cluster(word) for word in t.lower().strip().split())


def _alliteration_increment(iid: str, kw: dict[str, Any]) -> Check:
    def run(sentence: str) -> int:
        words = [clean for clean in (w.lstrip(_EDGE) for w in sentence.lower().split()) if clean]
        total, chained = 0, False
        for a, b in zip(words, words[1:]):
            if a[0] == b[0]:
                total += 1 if chained else 2
                chained = True
            else:
                chained = False
        return total

    def check(t: str) -> bool:
        runs = [run(s) for s in split_sentences(t)]
        return all(b > a for a, b in zip([-1] + runs, runs))
    return check


def _palindrome(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        words = strip_punctuation(t).lower().split()
        return sum(1 for w in words if w == w[::-1] and len(w) >= 5) >= 10
    return check


def _prime_lengths(iid: str, kw: dict[str, Any]) -> Check:
    return lambda t: all(len(word) in _PRIMES for word in strip_punctuation(t).split())


def _repeats(iid: str, kw: dict[str, Any]) -> Check:
    n = integer(iid, kw, "small_n")
    return lambda t: all(c <= n for c in Counter(strip_punctuation(t.lower()).split()).values())


def _sentence_keyword(iid: str, kw: dict[str, Any]) -> Check:
    word, n = string(iid, kw, "word"), integer(iid, kw, "N", 1)
    pattern = re.compile(rf"\b{re.escape(word)}\b", re.IGNORECASE)

    def check(t: str) -> bool:
        sentences = split_sentences(t)
        return len(sentences) >= n and pattern.search(sentences[n - 1]) is not None
    return check


def _odd_even_syllables(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        import syllapy  # loads its dictionary once per process

        parities = [syllapy.count(w) % 2 for w in strip_punctuation(t).lower().split() if w.strip()]
        return all(a != b for a, b in zip(parities, parities[1:]))
    return check


def _last_first(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        sentences = split_sentences(t)
        for current, following in zip(sentences, sentences[1:]):
            last, first = current.rstrip(_EDGE).split(), following.lstrip(_EDGE).split()
            if not last or not first or last[-1].lower() != first[0].lower():
                return False
        return True
    return check


def _paragraph_last_first(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        for paragraph in t.split("\n"):
            words = paragraph.strip().lower().strip(_EDGE).split()
            if words and words[0] != words[-1]:
                return False
        return True
    return check


def _increment(iid: str, kw: dict[str, Any]) -> Check:
    step = integer(iid, kw, "small_n")

    def check(t: str) -> bool:
        counts = [len(strip_punctuation(s).split()) for s in split_sentences(t)]
        return bool(counts) and all(b == a + step for a, b in zip(counts, counts[1:]))
    return check


def _no_consecutive(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        words = strip_punctuation(t.lower()).split()
        return all(a[0] != b[0] for a, b in zip(words, words[1:]))
    return check


def _keywords_specific_position(iid: str, kw: dict[str, Any]) -> Check:
    keyword = string(iid, kw, "keyword").strip().lower()
    n, m = integer(iid, kw, "n", 1), integer(iid, kw, "m", 1)

    def check(t: str) -> bool:
        sentences = split_sentences(t)
        if len(sentences) < n:
            return False
        words = [w for w in nltk_words(sentences[n - 1]) if any(ch.isalnum() for ch in w)]
        return len(words) >= m and words[m - 1].lower() == keyword
    return check


def _words_position(iid: str, kw: dict[str, Any]) -> Check:
    keyword = string(iid, kw, "keyword").strip().lower()

    def check(t: str) -> bool:
        words = nltk_words(t)
        if len(words) < 2:
            return False
        if words[-1] in PUNCTUATION:  # a substring test, as IFBench's
            return len(words) >= 3 and words[1].lower() == words[-3].lower() == keyword
        return words[1].lower() == words[-2].lower() == keyword
    return check


REGISTRY: dict[str, Spec] = {
    "words:alphabet": Spec(_alphabet),
    "words:vowel": Spec(_vowel),
    "words:consonants": Spec(_consonants),
    "sentence:alliteration_increment": Spec(_alliteration_increment),
    "words:palindrome": Spec(_palindrome),
    "words:prime_lengths": Spec(_prime_lengths),
    "words:repeats": Spec(_repeats),
    "sentence:keyword": Spec(_sentence_keyword),
    "words:odd_even_syllables": Spec(_odd_even_syllables, slow=True),
    "words:last_first": Spec(_last_first),
    "words:paragraph_last_first": Spec(_paragraph_last_first),
    "sentence:increment": Spec(_increment),
    "words:no_consecutive": Spec(_no_consecutive),
    "words:keywords_specific_position": Spec(_keywords_specific_position, slow=True),
    "words:words_position": Spec(_words_position, slow=True),
}
