"""IFBench's counting and ratio instructions (`count:*`, `ratio:*`), with IFBench's kwargs and verdicts.

IFBench splits sentences with NLTK punkt (here its regex stand-in) and counts words as `\\w+`
tokens. A missing kwarg is a 400 where IFBench draws a random value.
"""
from __future__ import annotations

import re
from typing import Any

from .args import Check, Spec, integer, string
from .text import PUNCTUATION, count_words, nltk_words, split_sentences, strip_punctuation

# NLTK's English stopwords: IFBench counts `\w+` tokens against them, so the list's entries with an
# apostrophe ("you're", ...) can never match and are left out.
STOPWORDS = frozenset("""
i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her hers
herself it its itself they them their theirs themselves what which who whom this that these those am is
are was were be been being have has had having do does did doing a an the and but if or because as until
while of at by for with about against between into through during before after above below to from up
down in out on off over under again further then once here there when where why how all any both each
few more most other some such no nor not only own same so than too very s t can will just don should now
d ll m o re ve y ain aren couldn didn doesn hadn hasn haven isn ma mightn mustn needn shan shouldn wasn
weren won wouldn
""".split())
CONJUNCTIONS = frozenset({"and", "but", "for", "nor", "or", "so", "yet"})
PERSON_NAMES = (
    "Emma Liam Sophia Jackson Olivia Noah Ava Lucas Isabella Mason Mia Ethan Charlotte Alexander Amelia "
    "Benjamin Harper Leo Zoe Daniel Chloe Samuel Lily Matthew Grace Owen Abigail Gabriel Ella Jacob Scarlett "
    "Nathan Victoria Elijah Layla Nicholas Audrey David Hannah Christopher Penelope Thomas Nora Andrew Aria "
    "Joseph Claire Ryan Stella Jonathan").split()
_NAMES = re.compile(rf"\b(?:{'|'.join(PERSON_NAMES)})\b")  # one pass finds the same names as one search each
PRONOUNS = frozenset("""
i me we us you he him she her it they them my mine our ours your yours his hers its their theirs myself
ourselves yourself yourselves himself herself itself themselves this that these those who whom whose which
what whoever whomever whatever whichever anybody anyone anything everybody everyone everything nobody
nothing somebody someone something each either neither both all some any none
""".split())
_JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")
_DIGITS = re.compile(r"\d+")
_EDGE = PUNCTUATION + " "


def _word_count_range(iid: str, kw: dict[str, Any]) -> Check:
    low, high = integer(iid, kw, "min_words"), integer(iid, kw, "max_words")
    return lambda t: low <= count_words(t) <= high


def _unique_word_count(iid: str, kw: dict[str, Any]) -> Check:
    n = integer(iid, kw, "N")
    return lambda t: len({word.strip(_EDGE) for word in t.lower().split()}) >= n


def _stop_words(iid: str, kw: dict[str, Any]) -> Check:
    percentage = integer(iid, kw, "percentage")

    def check(t: str) -> bool:
        words = re.findall(r"\w+", t)
        return bool(words) and sum(w.lower() in STOPWORDS for w in words) / len(words) * 100 <= percentage
    return check


def _ends(sentences: list[str], mark: str) -> int:
    return sum(1 for sentence in sentences if sentence.endswith(mark))


def _sentence_type(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        sentences = split_sentences(t)
        return _ends(sentences, ".") == 2 * _ends(sentences, "?")
    return check


def _sentence_balance(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        sentences = split_sentences(t)
        return _ends(sentences, ".") == _ends(sentences, "?") == _ends(sentences, "!")
    return check


def _conjunctions(iid: str, kw: dict[str, Any]) -> Check:
    n = integer(iid, kw, "small_n")
    # IFBench keeps the words as written (with their punctuation), so "and" and "and," count as two
    return lambda t: len({w for w in t.split() if w.strip(_EDGE).lower() in CONJUNCTIONS}) >= n


def _person_names(iid: str, kw: dict[str, Any]) -> Check:
    n = integer(iid, kw, "N")
    return lambda t: len(set(_NAMES.findall(t))) >= n


def _overlap(iid: str, kw: dict[str, Any]) -> Check:
    reference, percentage = string(iid, kw, "reference_text"), integer(iid, kw, "percentage")
    reference_trigrams = {reference[i:i + 3] for i in range(len(reference) - 2)}

    def check(t: str) -> bool:
        trigrams = {t[i:i + 3] for i in range(len(t) - 2)}  # character trigrams, as IFBench's nltk.ngrams(str, 3)
        if not trigrams:
            return False
        return percentage - 2 <= len(trigrams & reference_trigrams) / len(trigrams) * 100 <= percentage + 2
    return check


def _numbers(iid: str, kw: dict[str, Any]) -> Check:
    n = integer(iid, kw, "N")
    return lambda t: len(_DIGITS.findall(strip_punctuation(t))) == n


def _punctuation(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        if not ("!?" in t or "?!" in t or "\u203d" in t):
            return False
        rest = t.replace("?!", "", 1)
        if len(rest) == len(t):
            rest = t.replace("!?", "", 1)
        return {".", ",", "!", "?", ";", ":"} <= set(rest)
    return check


def _sentence_words(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        sentences = split_sentences(t)
        return len(sentences) == 3 and len({len(s.strip()) for s in sentences}) == 1
    return check


def _words_japanese(iid: str, kw: dict[str, Any]) -> Check:
    n = integer(iid, kw, "N", 1)

    def check(t: str) -> bool:
        for position, word in enumerate(t.split(), 1):
            word = word.strip(_EDGE)
            if position % n == 0 and word and not word.isdigit() and not _JAPANESE.search(word):
                return False
        return True
    return check


def _pronouns(iid: str, kw: dict[str, Any]) -> Check:
    n = integer(iid, kw, "N")
    return lambda t: sum(1 for w in nltk_words(t.replace("/", " ").lower()) if w in PRONOUNS) >= n


def _keywords_multiple(iid: str, kw: dict[str, Any]) -> Check:
    wanted = [(string(iid, kw, f"keyword{i}").strip().lower(), count)
              for i, count in zip(range(1, 6), (1, 2, 3, 5, 7))]
    return lambda t: all(t.lower().count(keyword) == count for keyword, count in wanted)


REGISTRY: dict[str, Spec] = {
    "count:word_count_range": Spec(_word_count_range),
    "count:unique_word_count": Spec(_unique_word_count),
    "ratio:stop_words": Spec(_stop_words),
    "ratio:sentence_type": Spec(_sentence_type),
    "ratio:sentence_balance": Spec(_sentence_balance),
    "count:conjunctions": Spec(_conjunctions),
    "count:person_names": Spec(_person_names),
    "ratio:overlap": Spec(_overlap),
    "count:numbers": Spec(_numbers),
    "count:punctuation": Spec(_punctuation),
    "ratio:sentence_words": Spec(_sentence_words),
    "count:words_japanese": Spec(_words_japanese),
    "count:pronouns": Spec(_pronouns, slow=True),
    "count:keywords_multiple": Spec(_keywords_multiple),
}
