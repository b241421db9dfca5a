"""IFEval's verifiable instructions, and the registry of every instruction id (pure functions, no I/O).

Rows use IFEval's format: `instruction_id_list` (e.g. `keywords:existence`) and a
parallel `kwargs` list of dicts. Each check follows the semantics of Google's IFEval
checker; `None` kwargs are dropped as IFEval does. Where IFEval needs NLTK data that a
server cannot download (punkt sentence splitting, `word_tokenize`) a regex equivalent
is used (text.py); language detection uses `langdetect` like IFEval. The open-instruct
(open_instruct.py) and IFBench (ifbench_*.py) ids live in modules of their own.

Loose checking is IFEval's: an instruction passes if it passes on any of the response,
the response without its first line, without its last line, without both, and each of
those with asterisks removed.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from . import ifbench_count, ifbench_custom, ifbench_format, ifbench_words, open_instruct
from .args import Check, InstructionError, Spec
from .args import compare as _compare
from .args import integer as _int
from .args import relation as _relation
from .args import string as _str
from .args import strings as _strs
from .text import count_sentences, count_words, detect_language, nltk_words

__all__ = ["REGISTRY", "UNSUPPORTED", "InstructionError", "check_row", "count_sentences", "count_words",
           "loose_variants", "parse_row"]

CONSTRAINED_RESPONSES = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


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
    return lambda t: _compare(sum(1 for w in nltk_words(t) if w.isupper()), relation, n)


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
    "change_case:capital_word_frequency": Spec(_capital_word_frequency, slow=True),
    "change_case:english_capital": Spec(_english_capital, slow=True),
    "change_case:english_lowercase": Spec(_english_lowercase, slow=True),
    "punctuation:no_comma": Spec(_no_comma),
}
IFEVAL_IDS = frozenset(REGISTRY)
REGISTRY.update(open_instruct.REGISTRY)
REGISTRY["letters:letter_counting2"] = REGISTRY["keywords:letter_frequency"]  # open-instruct's alias
for _family in (ifbench_count, ifbench_words, ifbench_format, ifbench_custom):
    REGISTRY.update(_family.REGISTRY)
# ids of the reference registries that need what a server here cannot have; a row with one is a 400
UNSUPPORTED: dict[str, str] = dict(ifbench_words.UNSUPPORTED)


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
        if isinstance(iid, str) and iid in UNSUPPORTED:
            raise InstructionError(f"instruction_id_list: instruction id {iid!r} is not supported here: "
                                   f"{UNSUPPORTED[iid]}")
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
