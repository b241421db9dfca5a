"""Text helpers shared by the instruction checks: word counts, sentence splitters, tokenizers.

IFEval and IFBench split sentences with NLTK punkt and tokenize words with NLTK's `word_tokenize`;
punkt needs downloaded data that a server cannot fetch, so `split_sentences` is a regex stand-in
for it, and `nltk_words` runs NLTK's own (data-free) Treebank word tokenizer on those sentences.
open-instruct's checks use IFEval's regex splitter, kept as is (`split_sentences_ifeval_regex`).
"""
from __future__ import annotations

import re
import string
from functools import lru_cache
from typing import Any

PUNCTUATION = string.punctuation
_NO_PUNCTUATION = str.maketrans("", "", string.punctuation)
_WORD = re.compile(r"\w+")
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "inc", "ltd", "co", "corp", "e.g", "i.e",
    "mt", "no", "fig", "approx", "dept", "est", "gen", "gov", "jan", "feb", "mar", "apr", "jun", "jul", "aug",
    "sep", "sept", "oct", "nov", "dec", "u.s", "a.m", "p.m",
}
# Linear-time regexes throughout: a run of dots, spaces or brackets must not make a check
# quadratic (responses can be a megabyte). Lookbehinds pin each match to the start of a run.
_SENTENCE_END = re.compile(r"(?<![.!?])[.!?]+[\"')\]]*(?=\s|$)")
_NEXT_CHAR = re.compile(r"\s*(\S)")


def count_words(text: str) -> int:
    """IFEval counts `\\w+` tokens (NLTK's RegexpTokenizer(r"\\w+"))."""
    return len(_WORD.findall(text))


def split_sentences(text: str) -> list[str]:
    """Sentences ending in . ! ? followed by whitespace, skipping abbreviations, initials and decimals.

    A regex stand-in for NLTK punkt (which IFEval uses and which needs downloaded data).
    """
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        end = match.end()
        if match.group(0).startswith(".") and len(match.group(0).rstrip("\"')]")) == 1:
            before = text[max(start, match.start() - 32):match.start()].split()  # abbreviations are short
            last = before[-1].lower().lstrip("(\"'") if before else ""
            if last in _ABBREVIATIONS or (len(last) == 1 and last.isalpha()) or re.fullmatch(r"(?:[a-z]\.)+[a-z]", last):
                continue
            nxt = _NEXT_CHAR.match(text, end)
            following = nxt.group(1) if nxt else ""
            if following.islower():
                continue
        piece = text[start:end].strip()
        if piece:
            sentences.append(piece)
        start = end
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def count_sentences(text: str) -> int:
    return len(split_sentences(text))


def detect_language(text: str) -> str | None:
    """ISO 639-1 code via langdetect (deterministic seed); None when undetectable."""
    from langdetect import DetectorFactory, LangDetectException, detect

    DetectorFactory.seed = 0
    try:
        return detect(text)
    except LangDetectException:
        return None


_OI_STARTERS = (r"(Mr|Mrs|Ms|Dr|Prof|Capt|Cpt|Lt|He\s|She\s|It\s|They\s|Their\s|Our\s|We\s|But\s|However\s|"
                r"That\s|This\s|Wherever)")
_OI_SENTENCE_STEPS = [
    (re.compile(r"(Mr|St|Mrs|Ms|Dr)[.]"), "\\1<prd>"),
    (re.compile(r"[.](com|net|org|io|gov|edu|me)"), "<prd>\\1"),
    (re.compile(r"([0-9])[.]([0-9])"), "\\1<prd>\\2"),
]
_OI_LATER_STEPS = [
    (re.compile(r"\s([A-Za-z])[.] "), " \\1<prd> "),
    (re.compile(r"([A-Z][.][A-Z][.](?:[A-Z][.])?) " + _OI_STARTERS), "\\1<stop> \\2"),
    (re.compile(r"([A-Za-z])[.]([A-Za-z])[.]([A-Za-z])[.]"), "\\1<prd>\\2<prd>\\3<prd>"),
    (re.compile(r"([A-Za-z])[.]([A-Za-z])[.]"), "\\1<prd>\\2<prd>"),
    (re.compile(r" (Inc|Ltd|Jr|Sr|Co)[.] " + _OI_STARTERS), " \\1<stop> \\2"),
    (re.compile(r" (Inc|Ltd|Jr|Sr|Co)[.]"), " \\1<prd>"),
    (re.compile(r" ([A-Za-z])[.]"), " \\1<prd>"),
]
_OI_DOTS = re.compile(r"\.{2,}")


def split_sentences_ifeval_regex(text: str) -> list[str]:
    """IFEval's regex sentence splitter (its `split_into_sentences`), which open-instruct's
    sentence checks use: kept as is, so verdicts match NeMo-Gym's."""
    text = (" " + text + "  ").replace("\n", " ")
    for pattern, replacement in _OI_SENTENCE_STEPS:
        text = pattern.sub(replacement, text)
    text = _OI_DOTS.sub(lambda m: "<prd>" * len(m.group(0)) + "<stop>", text)
    text = text.replace("Ph.D.", "Ph<prd>D<prd>")
    for pattern, replacement in _OI_LATER_STEPS:
        text = pattern.sub(replacement, text)
    text = text.replace(".\u201d", "\u201d.").replace('."', '".').replace('!"', '"!').replace('?"', '"?')
    text = text.replace(".", ".<stop>").replace("?", "?<stop>").replace("!", "!<stop>").replace("<prd>", ".")
    sentences = [piece.strip() for piece in text.split("<stop>")]
    return sentences[:-1] if sentences and not sentences[-1] else sentences


def strip_punctuation(text: str) -> str:
    """The text without ASCII punctuation (`str.translate` with `string.punctuation`, as IFBench does)."""
    return text.translate(_NO_PUNCTUATION)


@lru_cache(maxsize=1)
def _treebank() -> Any:
    from nltk.tokenize.destructive import NLTKWordTokenizer  # imported once, in the worker that needs it

    return NLTKWordTokenizer()


def nltk_words(text: str) -> list[str]:
    """NLTK's `word_tokenize`: punctuation and contractions are tokens of their own (`n't`, `,`, `.`)."""
    tokenizer = _treebank()
    return [token for sentence in split_sentences(text) for token in tokenizer.tokenize(sentence)]
