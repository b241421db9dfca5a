"""Multiple-choice answer extraction (pure functions, no I/O).

Options come in the shapes NeMo-Gym and common datasets use: a list of one-key dicts
(`[{"A": "..."}, {"B": "..."}]`), a dict (`{"A": "...", "B": "..."}`), or a plain list
of option texts (lettered A, B, C, ... in order). The chosen letter is found by trying
regex patterns in order; for each pattern the LAST match whose letter is one of the
options wins (models reason first and answer last). Only option letters count.
"""
from __future__ import annotations

import re
import string
import unicodedata
from typing import Any, Iterable

# Every default pattern is linear-time: no two adjacent quantifiers can match the same
# character, so a long run of spaces or brackets in a response cannot make them backtrack.
ANSWER_COLON = r"(?i)\banswer(?:\s+is)?\s*[:：][\s*_`(\[]*([A-Za-z])(?![A-Za-z])"
ANSWER_IS = r"(?i:\banswer\s+is)[\s*_`(\[]*([A-Z])(?![A-Za-z])"
BOXED = r"\\boxed\{[\s(\[]*(?:\\text(?:bf)?\{[\s(\[]*)?([A-Za-z])[\s)\]]*\}"
FINAL_LETTER = r"(?<![A-Za-z0-9(\[*])[(\[*]*([A-Z])[)\]*.!\s]*\Z"

DEFAULT_PATTERNS: tuple[str, ...] = (ANSWER_COLON, ANSWER_IS, BOXED, FINAL_LETTER)

# NeMo-Gym mcqa rows may name a grading mode; these are its extraction rules (NeMo-Gym 0.7.0's
# semantics: the boxed modes read only the LAST \boxed{...}, a bare letter or a leading label).
GRADING_MODES: dict[str, tuple[tuple[str, ...], str | None]] = {
    # mode: (letter patterns, rule tried after them: "strict_boxed" | "lenient_boxed" | "answer_colon" | None)
    "strict_single_letter_boxed": ((), "strict_boxed"),
    "lenient_boxed": ((), "lenient_boxed"),
    "lenient_answer_colon": ((r"(?i)answer[^\S\n]*:[^\S\n]*([A-Za-z])[^\S\n]*$",), "answer_colon"),
}
NEMO_GYM_DEFAULT_MODE = "strict_single_letter_boxed"  # NeMo-Gym's mode for a row that names none
_ANSWER_CONTENT = re.compile(r"(?i)answer[^\S\n]*:(.+)")
_TEXT_WRAPPER = re.compile(r"\\text\{\s*(.*?)\s*\}", re.S)
_BOX_LETTER_ONLY = re.compile(r"^[^A-Za-z]*([A-Z])[^A-Za-z]*$")  # "E", "[C]", "{B}"
_BOX_LETTER_LABEL = re.compile(r"^\s*([A-Z])\s*[:).\-]")  # "C: Paris", "C) Paris"


class OptionsError(ValueError):
    """The row's options or expected letter are malformed; the message names the field."""


def normalize_options(raw: Any) -> dict[str, str]:
    """`{LETTER: text}` from any supported options shape."""
    found: dict[str, str] = {}
    if isinstance(raw, dict):
        items: Iterable[tuple[Any, Any]] = raw.items()
    elif isinstance(raw, list) and raw and all(isinstance(x, dict) for x in raw):
        items = [kv for entry in raw for kv in list(entry.items())[:1]]
    elif isinstance(raw, list) and raw and all(isinstance(x, (str, int, float)) for x in raw):
        if len(raw) > 26:
            raise OptionsError(f"options: {len(raw)} plain options is more than 26 letters")
        items = zip(string.ascii_uppercase, raw)
    else:
        raise OptionsError("options: expected a non-empty list of {letter: text} objects, a {letter: text} "
                           "object, or a list of option texts")
    for key, text in items:
        if not isinstance(key, str) or len(key.strip()) != 1 or not key.strip().isalpha():
            raise OptionsError(f"options: key {key!r} is not a single letter")
        found[key.strip().upper()] = "" if text is None else str(text)
    if not found:
        raise OptionsError("options: empty")
    return found


def normalize_expected(raw: Any, options: dict[str, str]) -> str:
    if not isinstance(raw, str) or len(raw.strip()) != 1 or not raw.strip().isalpha():
        raise OptionsError(f"expected_answer: expected a single option letter, got {raw!r}")
    letter = raw.strip().upper()
    if letter not in options:
        raise OptionsError(f"expected_answer: {letter!r} is not one of the options {sorted(options)}")
    return letter


def compile_patterns(patterns: Iterable[str], *, where: str = "patterns",
                     flags: int = re.MULTILINE) -> list[re.Pattern[str]]:
    compiled = []
    for pattern in patterns:
        try:
            regex = re.compile(pattern, flags)
        except re.error as exc:
            raise ValueError(f"{where}: invalid regex {pattern!r}: {exc}") from None
        if regex.groups < 1:
            raise ValueError(f"{where}: regex {pattern!r} needs a capture group for the letter")
        compiled.append(regex)
    return compiled


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _strip_text_wrappers(text: str) -> str:
    while (match := _TEXT_WRAPPER.fullmatch(text)) is not None:
        text = match.group(1)
    return text


def last_boxed(text: str) -> str | None:
    """Everything inside the last \\boxed{...}, braces counted (so \\boxed{\\text{E}} and \\boxed{{B}} work)."""
    start = text.rfind("\\boxed{")
    if start == -1:
        return None
    depth = 0
    begin = start + len("\\boxed{")
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                return text[begin:i]
            depth -= 1
    return None


def boxed_letter(text: str, options: dict[str, str]) -> str | None:
    """The letter of the last box: a bare letter (`{B}`, `(C)`) or a leading label (`C: Paris`)."""
    inner = last_boxed(text)
    if inner is None:
        return None
    inner = _strip_text_wrappers(inner.strip())
    match = _BOX_LETTER_ONLY.match(inner) or _BOX_LETTER_LABEL.match(inner)
    return match.group(1) if match and match.group(1) in options else None


def boxed_option_text(text: str, options: dict[str, str]) -> str | None:
    """The one option whose text appears in the last box (with or without \\text{...}), else None."""
    inner = last_boxed(text)
    if inner is None:
        return None
    candidates = {_norm(inner.strip()), _norm(_strip_text_wrappers(inner.strip()))}
    hits = {letter for letter, option in options.items()
            if _norm(option) and any(_norm(option) in c for c in candidates)}
    return hits.pop() if len(hits) == 1 else None


def match_option_text(candidate: str, options: dict[str, str]) -> str | None:
    """The one letter whose option text equals `candidate` (normalized), else None."""
    wanted = _norm(_strip_text_wrappers(candidate.strip()))
    hits = {letter for letter, text in options.items() if text.strip() and _norm(text) == wanted}
    return hits.pop() if len(hits) == 1 else None


# letters other scripts write for A-D, read as NeMo-Gym reads them
_LETTER_LOOKALIKES = str.maketrans({"أ": " A", "ب": " B", "ج": " C", "د": " D", "অ": " A", "ব": " B", "ড": " C",
                                    "ঢ": " D"})


def row_regex_letter(text: str, regex: re.Pattern[str], options: dict[str, str]) -> str | None:
    """A row's own `output_regex`, as NeMo-Gym applies it: the last match only, any letter it
    captures (the row's regex is trusted even for a letter outside the options), else option text."""
    matches = list(regex.finditer(text))
    if not matches:
        return None
    captured = unicodedata.normalize("NFKC", matches[-1].group(1) or "").translate(_LETTER_LOOKALIKES)
    captured = captured.strip().upper()
    if len(captured) == 1 and captured.isalpha():
        return captured
    return match_option_text(captured, options)


def extract_letter(text: str, options: dict[str, str], patterns: list[re.Pattern[str]],
                   rule: str | None = None, row_regexes: list[re.Pattern[str]] | None = None) -> str | None:
    """The chosen letter, or None when no row regex, pattern or rule yields one.

    `rule` is a grading mode's rule; without one (gymserve's default patterns) the last box's
    letter is the final fallback.
    """
    for regex in row_regexes or []:
        found = row_regex_letter(text, regex, options)
        if found is not None:
            return found
    for regex in patterns:
        chosen = None
        for match in regex.finditer(text):
            captured = (match.group(1) or "").strip()
            if len(captured) == 1 and captured.upper() in options:
                chosen = captured.upper()
            elif len(captured) > 1:
                chosen = match_option_text(captured, options) or chosen
        if chosen is not None:
            return chosen
    if rule in (None, "strict_boxed"):
        return boxed_letter(text, options)
    if rule == "lenient_boxed":
        return boxed_letter(text, options) or boxed_option_text(text, options)
    if rule == "answer_colon":
        answer = _ANSWER_CONTENT.search(text)
        if answer:
            return match_option_text(answer.group(1), options)
    return None
