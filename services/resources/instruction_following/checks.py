"""IFEval verifiable instructions (pure functions, no I/O).

Rows use IFEval's format: `instruction_id_list` (e.g. `keywords:existence`) and a
parallel `kwargs` list of dicts. Each check follows the semantics of Google's IFEval
checker; `None` kwargs are dropped as IFEval does. Where IFEval needs NLTK data that a
server cannot download (punkt sentence splitting, `word_tokenize`) a regex equivalent
is used; language detection uses `langdetect` like IFEval.

Loose checking is IFEval's: an instruction passes if it passes on any of the response,
the response without its first line, without its last line, without both, and each of
those with asterisks removed.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

RELATIONS = ("less than", "at least")
CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


class InstructionError(ValueError):
    """An unknown instruction id or bad kwargs; the message names the instruction and the argument."""


# --------------------------------------------------------------------------- #
# Text helpers
# --------------------------------------------------------------------------- #
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


_TOKEN = re.compile(r"\w+(?:[-'’]\w+)*|[^\w\s]")


def word_tokens(text: str) -> list[str]:
    """Words (hyphenated words count as one) and punctuation, like NLTK's word_tokenize for casing checks."""
    return _TOKEN.findall(text)


def detect_language(text: str) -> str | None:
    """ISO 639-1 code via langdetect (deterministic seed); None when undetectable."""
    from langdetect import DetectorFactory, LangDetectException, detect

    DetectorFactory.seed = 0
    try:
        return detect(text)
    except LangDetectException:
        return None


# --------------------------------------------------------------------------- #
# Argument helpers
# --------------------------------------------------------------------------- #
def _int(iid: str, kwargs: dict[str, Any], name: str, minimum: int = 0) -> int:
    value = kwargs.get(name)
    if value is None:
        raise InstructionError(f"{iid}: missing kwarg {name!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InstructionError(f"{iid}: kwarg {name!r} must be an integer, got {type(value).__name__}")
    try:
        number = int(value)
    except ValueError:
        raise InstructionError(f"{iid}: kwarg {name!r} must be an integer, got {value!r}") from None
    if isinstance(value, float) and number != value:
        raise InstructionError(f"{iid}: kwarg {name!r} must be an integer, got {value!r}")
    if number < minimum:
        raise InstructionError(f"{iid}: kwarg {name!r} must be >= {minimum}, got {number}")
    return number


def _str(iid: str, kwargs: dict[str, Any], name: str) -> str:
    value = kwargs.get(name)
    if not isinstance(value, str) or not value.strip():
        raise InstructionError(f"{iid}: kwarg {name!r} must be a non-empty string")
    return value


def _strs(iid: str, kwargs: dict[str, Any], name: str) -> list[str]:
    value = kwargs.get(name)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise InstructionError(f"{iid}: kwarg {name!r} must be a non-empty list of strings")
    return value


def _relation(iid: str, kwargs: dict[str, Any], name: str) -> str:
    value = kwargs.get(name)
    if value not in RELATIONS:
        raise InstructionError(f"{iid}: kwarg {name!r} must be one of {list(RELATIONS)}, got {value!r}")
    return value


def _compare(count: int, relation: str, threshold: int) -> bool:
    return count < threshold if relation == "less than" else count >= threshold


# --------------------------------------------------------------------------- #
# Checks: each `build(iid, kwargs) -> (text -> bool)` validates kwargs up front
# --------------------------------------------------------------------------- #
Check = Callable[[str], bool]


def _keywords_existence(iid: str, kw: dict[str, Any]) -> Check:
    words = [re.compile(re.escape(w), re.IGNORECASE) for w in _strs(iid, kw, "keywords")]
    return lambda t: all(w.search(t) for w in words)


def _keywords_frequency(iid: str, kw: dict[str, Any]) -> Check:
    word = re.compile(re.escape(_str(iid, kw, "keyword").strip()), re.IGNORECASE)
    frequency, relation = _int(iid, kw, "frequency"), _relation(iid, kw, "relation")
    return lambda t: _compare(len(word.findall(t)), relation, frequency)


def _forbidden_words(iid: str, kw: dict[str, Any]) -> Check:
    words = [re.compile(r"\b" + re.escape(w) + r"\b", re.IGNORECASE) for w in _strs(iid, kw, "forbidden_words")]
    return lambda t: not any(w.search(t) for w in words)


def _letter_frequency(iid: str, kw: dict[str, Any]) -> Check:
    letter = _str(iid, kw, "letter").strip().lower()
    if len(letter) != 1:
        raise InstructionError(f"{iid}: kwarg 'letter' must be a single letter, got {letter!r}")
    frequency, relation = _int(iid, kw, "let_frequency"), _relation(iid, kw, "let_relation")
    return lambda t: _compare(Counter(t.lower())[letter], relation, frequency)


def _response_language(iid: str, kw: dict[str, Any]) -> Check:
    language = _str(iid, kw, "language").strip()
    return lambda t: detect_language(t) in (language, None)  # undetectable counts as followed (IFEval)


def _number_sentences(iid: str, kw: dict[str, Any]) -> Check:
    n, relation = _int(iid, kw, "num_sentences"), _relation(iid, kw, "relation")
    return lambda t: _compare(count_sentences(t), relation, n)


def _number_words(iid: str, kw: dict[str, Any]) -> Check:
    n, relation = _int(iid, kw, "num_words"), _relation(iid, kw, "relation")
    return lambda t: _compare(count_words(t), relation, n)


def _number_paragraphs(iid: str, kw: dict[str, Any]) -> Check:
    n = _int(iid, kw, "num_paragraphs")

    def check(t: str) -> bool:
        parts = re.split(r"\s?\*\*\*\s?", t)
        count = len(parts)
        for i, part in enumerate(parts):
            if not part.strip():
                if i in (0, len(parts) - 1):
                    count -= 1
                else:
                    return False
        return count == n
    return check


def _nth_paragraph_first_word(iid: str, kw: dict[str, Any]) -> Check:
    n, nth = _int(iid, kw, "num_paragraphs"), _int(iid, kw, "nth_paragraph", 1)
    first_word = _str(iid, kw, "first_word").strip().lower()

    def check(t: str) -> bool:
        parts = t.split("\n\n")
        count = sum(1 for p in parts if p.strip())
        if nth > count:
            return False
        paragraph = parts[nth - 1].strip()
        if not paragraph:
            return False
        word = paragraph.split()[0].strip().lstrip("'").lstrip('"')
        found = ""
        for ch in word:
            if ch in {".", ",", "?", "!", "'", '"'}:
                break
            found += ch.lower()
        return count == n and found == first_word
    return check


def count_placeholders(text: str) -> int:
    r"""IFEval's `len(re.findall(r"\[.*?\]", text))` in linear time.

    A `[` with no `]` before the end of its line cannot match, and neither can any later
    `[` on that line, so the scan skips to the next line instead of retrying each one.
    """
    count, pos = 0, 0
    while (open_at := text.find("[", pos)) != -1:
        line_end = text.find("\n", open_at)
        close_at = text.find("]", open_at + 1, len(text) if line_end == -1 else line_end)
        if close_at == -1:
            if line_end == -1:
                break
            pos = line_end + 1
        else:
            count += 1
            pos = close_at + 1
    return count


def _placeholders(iid: str, kw: dict[str, Any]) -> Check:
    n = _int(iid, kw, "num_placeholders")
    return lambda t: count_placeholders(t) >= n


def _postscript(iid: str, kw: dict[str, Any]) -> Check:
    marker = _str(iid, kw, "postscript_marker").strip()
    # IFEval's patterns also have a leading `\s*` and a trailing `.*$`: neither changes
    # whether there is a match, and the leading one is quadratic on long whitespace runs.
    if marker == "P.P.S":
        pattern = r"p\.\s?p\.\s?s"
    elif marker == "P.S.":
        pattern = r"p\.\s?s\."
    else:
        pattern = re.escape(marker.lower())
    regex = re.compile(pattern)
    return lambda t: regex.search(t.lower()) is not None


def _bullets(iid: str, kw: dict[str, Any]) -> Check:
    n = _int(iid, kw, "num_bullets")
    # IFEval's `^\s*` may run across blank lines; starting each match at its own line gives
    # the same count without rescanning every blank line from every line start.
    star = re.compile(r"^[^\S\n]*\*[^\*].*$", re.MULTILINE)
    dash = re.compile(r"^[^\S\n]*-.*$", re.MULTILINE)
    return lambda t: len(star.findall(t)) + len(dash.findall(t)) == n


def _constrained_response(iid: str, kw: dict[str, Any]) -> Check:
    return lambda t: any(option in t.strip() for option in CONSTRAINED_RESPONSES)


def _highlights(iid: str, kw: dict[str, Any]) -> Check:
    n = _int(iid, kw, "num_highlights")

    def check(t: str) -> bool:
        count = sum(1 for h in re.findall(r"\*[^\n\*]*\*", t) if h.strip("*").strip())
        count += sum(1 for h in re.findall(r"\*\*[^\n\*]*\*\*", t) if h[2:-2].strip())
        return count >= n
    return check


def _sections(iid: str, kw: dict[str, Any]) -> Check:
    splitter = _str(iid, kw, "section_spliter").strip()
    n = _int(iid, kw, "num_sections")
    regex = re.compile(r"\s?" + re.escape(splitter) + r"\s?\d+\s?")
    return lambda t: len(regex.split(t)) - 1 >= n


def _json_format(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        value = t.strip()
        for prefix in ("```json", "```Json", "```JSON", "```"):
            value = value.removeprefix(prefix)
        value = value.removesuffix("```").strip()
        try:
            json.loads(value)
        except (ValueError, RecursionError):  # deeply nested brackets exhaust the decoder's stack
            return False
        return True
    return check


def has_title(text: str) -> bool:
    r"""IFEval's `<<[^\n]+>>` findall, in linear time: per line, the greedy match runs from the
    first `<<` to the last `>>`, and there is at most one per line."""
    for line in text.split("\n"):
        first, last = line.find("<<"), line.rfind(">>")
        if first != -1 and last >= first + 3 and line[first:last + 2].lstrip("<").rstrip(">").strip():
            return True
    return False


def _title(iid: str, kw: dict[str, Any]) -> Check:
    return has_title


def _two_responses(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        parts = t.split("******")
        valid = []
        for i, part in enumerate(parts):
            if not part.strip():
                if i not in (0, len(parts) - 1):
                    return False
            else:
                valid.append(part)
        return len(valid) == 2 and valid[0].strip() != valid[1].strip()
    return check


def _repeat_prompt(iid: str, kw: dict[str, Any]) -> Check:
    prompt = _str(iid, kw, "prompt_to_repeat").strip().lower()
    return lambda t: t.strip().lower().startswith(prompt)


def _end_checker(iid: str, kw: dict[str, Any]) -> Check:
    phrase = _str(iid, kw, "end_phrase").strip().lower()
    return lambda t: t.strip().strip('"').lower().endswith(phrase)


def _start_checker(iid: str, kw: dict[str, Any]) -> Check:
    starter = re.compile(r"^[^\S\n]*" + re.escape(_str(iid, kw, "starter").strip()), re.MULTILINE)
    return lambda t: starter.search(t) is not None


def _capital_word_frequency(iid: str, kw: dict[str, Any]) -> Check:
    n, relation = _int(iid, kw, "capital_frequency"), _relation(iid, kw, "capital_relation")
    return lambda t: _compare(sum(1 for w in word_tokens(t) if w.isupper()), relation, n)


def _english_capital(iid: str, kw: dict[str, Any]) -> Check:
    return lambda t: t.isupper() and detect_language(t) in ("en", None)


def _english_lowercase(iid: str, kw: dict[str, Any]) -> Check:
    return lambda t: t.islower() and detect_language(t) in ("en", None)


def _no_comma(iid: str, kw: dict[str, Any]) -> Check:
    return lambda t: "," not in t


def _quotation(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        value = t.strip()
        return len(value) > 1 and value[0] == '"' and value[-1] == '"'
    return check


# --------------------------------------------------------------------------- #
# open-instruct ids NeMo-Gym's example rows use (its `verifiable-instructions` semantics)
# --------------------------------------------------------------------------- #
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
_OI_LOWER_WORD = re.compile(r"\b[a-z]+\b")
_OI_LETTER = re.compile(r"[a-zA-Z]")
_OI_DIVIDER = re.compile(r"\s?\*\*\*\s?")
_OI_PUNCTUATION = re.compile(r"[^\w\s]")


def split_sentences_ifeval_regex(text: str) -> list[str]:
    """IFEval's regex sentence splitter (its `split_into_sentences`), which open-instruct's
    first-word check uses: kept as is, so verdicts match NeMo-Gym's."""
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


def _last_word_answer(iid: str, kw: dict[str, Any]) -> Check:
    word = _str(iid, kw, "last_word").strip().lower()
    return lambda t: bool(t.split()) and _OI_PUNCTUATION.sub("", t.split()[-1]).lower() == word


def _first_word_sent(iid: str, kw: dict[str, Any]) -> Check:
    word = _str(iid, kw, "first_word").strip().lower()

    def check(t: str) -> bool:
        return all(s.strip() and s.split()[0].lower() == word for s in split_sentences_ifeval_regex(t))
    return check


def _lowercase_counting(iid: str, kw: dict[str, Any]) -> Check:
    n = _int(iid, kw, "N", minimum=1)  # open-instruct counts every lowercase word, repeated or not
    return lambda t: len(_OI_LOWER_WORD.findall(t)) <= n


def _letter_counting(iid: str, kw: dict[str, Any]) -> Check:
    n, relation = _int(iid, kw, "N", minimum=1), _relation(iid, kw, "relation")
    return lambda t: _compare(len(_OI_LETTER.findall(t)), relation, n)


def _two_paragraphs(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        paragraphs = _OI_DIVIDER.split(t)
        inner = paragraphs[1:-1]
        if any(not p.strip() for p in inner):
            return False
        return len(paragraphs) - sum(1 for p in {0, len(paragraphs) - 1} if not paragraphs[p].strip()) == 2
    return check


@dataclass(frozen=True)
class Spec:
    build: Callable[[str, dict[str, Any]], Check]
    slow: bool = False  # needs language detection: run in the worker pool


REGISTRY: dict[str, Spec] = {
    "keywords:existence": Spec(_keywords_existence),
    "keywords:frequency": Spec(_keywords_frequency),
    "keywords:forbidden_words": Spec(_forbidden_words),
    "keywords:letter_frequency": Spec(_letter_frequency),
    "language:response_language": Spec(_response_language, slow=True),
    "length_constraints:number_sentences": Spec(_number_sentences),
    "length_constraints:number_paragraphs": Spec(_number_paragraphs),
    "length_constraints:number_words": Spec(_number_words),
    "length_constraints:nth_paragraph_first_word": Spec(_nth_paragraph_first_word),
    "detectable_content:number_placeholders": Spec(_placeholders),
    "detectable_content:postscript": Spec(_postscript),
    "detectable_format:number_bullet_lists": Spec(_bullets),
    "detectable_format:constrained_response": Spec(_constrained_response),
    "detectable_format:number_highlighted_sections": Spec(_highlights),
    "detectable_format:multiple_sections": Spec(_sections),
    "detectable_format:json_format": Spec(_json_format),
    "detectable_format:title": Spec(_title),
    "combination:two_responses": Spec(_two_responses),
    "combination:repeat_prompt": Spec(_repeat_prompt),
    "startend:end_checker": Spec(_end_checker),
    "startend:start_checker": Spec(_start_checker),
    "startend:quotation": Spec(_quotation),
    "change_case:capital_word_frequency": Spec(_capital_word_frequency),
    "change_case:english_capital": Spec(_english_capital, slow=True),
    "change_case:english_lowercase": Spec(_english_lowercase, slow=True),
    "punctuation:no_comma": Spec(_no_comma),
    "last_word:last_word_answer": Spec(_last_word_answer),
    "first_word:first_word_sent": Spec(_first_word_sent),
    "count:lowercase_counting": Spec(_lowercase_counting),
    "letters:letter_counting": Spec(_letter_counting),
    "paragraphs:paragraphs": Spec(_two_paragraphs),
}


# --------------------------------------------------------------------------- #
# Running a row
# --------------------------------------------------------------------------- #
def parse_row(instruction_ids: Any, kwargs_list: Any) -> list[tuple[str, dict[str, Any]]]:
    """Validated `(id, kwargs)` pairs; raises InstructionError naming the problem."""
    if not isinstance(instruction_ids, list) or not instruction_ids:
        raise InstructionError("instruction_id_list: expected a non-empty list of instruction ids")
    if kwargs_list is None:
        kwargs_list = [{} for _ in instruction_ids]
    if not isinstance(kwargs_list, list) or len(kwargs_list) != len(instruction_ids):
        raise InstructionError(f"kwargs: expected a list of {len(instruction_ids)} objects, "
                               "one per entry of instruction_id_list")
    pairs = []
    for iid, kwargs in zip(instruction_ids, kwargs_list):
        if not isinstance(iid, str) or iid not in REGISTRY:
            raise InstructionError(f"instruction_id_list: unknown instruction id {iid!r}; "
                                   f"supported: {', '.join(sorted(REGISTRY))}")
        if kwargs is None:
            kwargs = {}
        if not isinstance(kwargs, dict):
            raise InstructionError(f"kwargs for {iid}: expected an object, got {type(kwargs).__name__}")
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        REGISTRY[iid].build(iid, kwargs)  # validates now, so bad kwargs are a 4xx before any work
        pairs.append((iid, kwargs))
    return pairs


def needs_slow_path(pairs: list[tuple[str, dict[str, Any]]]) -> bool:
    return any(REGISTRY[iid].slow for iid, _ in pairs)


def loose_variants(response: str) -> list[str]:
    lines = response.split("\n")
    remove_first = "\n".join(lines[1:]).strip()
    remove_last = "\n".join(lines[:-1]).strip()
    remove_both = "\n".join(lines[1:-1]).strip()
    base = [response, remove_first, remove_last, remove_both]
    return base + [v.replace("*", "") for v in base]


def check_row(response: str, pairs: list[tuple[str, dict[str, Any]]], loose: bool) -> list[bool]:
    """Whether each instruction is followed (IFEval strict or loose); an empty response follows none."""
    candidates = [v for v in (loose_variants(response) if loose else [response]) if v.strip()]
    results = []
    for iid, kwargs in pairs:
        check = REGISTRY[iid].build(iid, kwargs)
        results.append(any(check(candidate) for candidate in candidates))
    return results
