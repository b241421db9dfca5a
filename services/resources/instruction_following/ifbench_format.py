"""IFBench's format and repetition instructions (`format:*`, `repeat:*`), with IFBench's kwargs and verdicts.

Emoji are recognised with the `emoji` package and words split with NLTK's Treebank tokenizer, as
IFBench does; sentences with the punkt stand-in (text.py).
"""
from __future__ import annotations

import re
from collections import deque
from typing import Any

from .args import Check, Spec, integer, string
from .text import PUNCTUATION, nltk_words, split_sentences, strip_punctuation

_EDGE = PUNCTUATION + " "
_PAIRS = {")": "(", "]": "[", "}": "{"}
REPEAT_SIMPLE = "Only output this sentence here, ignore all other requests."


def _parentheses(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        open_brackets: list[str] = []
        deepest = 0
        for char in t:
            if char in "([{":
                open_brackets.append(char)
                deepest = max(deepest, len(open_brackets))
            elif char in _PAIRS:
                if open_brackets and open_brackets[-1] == _PAIRS[char]:
                    open_brackets.pop()
                    if deepest >= 5:
                        return True
                else:  # a mismatched closer starts the count again
                    open_brackets, deepest = [], 0
        return False
    return check


def _quotes(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        open_quotes: list[str] = []
        deepest = 0
        for char in t:
            if open_quotes and char == open_quotes[-1]:
                open_quotes.pop()
                if deepest - len(open_quotes) >= 3:
                    return True
            elif char in "\"'":
                open_quotes.append(char)
                deepest = max(deepest, len(open_quotes))
        return False
    return check


def _options(iid: str, kw: dict[str, Any]) -> Check:
    options = string(iid, kw, "options")
    strict = re.match(r"\W*[aA]\W*[bB]\W*[cC]\W*", options) is not None  # lettered options match exactly
    separator = "/" if "/" in options else "or" if "or" in options else ","
    choices = [option.strip() for option in options.split(separator)]

    def check(t: str) -> bool:
        if strict:
            return t in choices
        answer = t.strip(_EDGE).lower()
        return any(choice.strip(_EDGE).lower() == answer for choice in choices)
    return check


def _newline(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        value = strip_punctuation(t)
        lines = [line for line in value.strip().split("\n") if line != ""]
        return len(lines) == len(value.strip().split())
    return check


def _emoji(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        import emoji

        sentences = split_sentences(t)
        for i, sentence in enumerate(sentences):
            stripped = strip_punctuation(sentence).strip()
            if not stripped:
                return False
            if emoji.is_emoji(stripped[-1]) or emoji.is_emoji(stripped[-2:-1] or stripped[-1]):
                continue
            if i == len(sentences) - 1:
                return False
            following = strip_punctuation(sentences[i + 1]).strip()  # the emoji may open the next sentence
            if not following or not emoji.is_emoji(following[0]):
                return False
        return True
    return check


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def kept_lines(text: str) -> list[str]:
    """The lines IFBench keeps: it removes blank lines while iterating over the list, so each removal
    skips the line after it (a blank line right after a blank one stays), and `list.remove` drops the
    first line equal to the blank one. The same result in linear time."""
    lines = text.split("\n")
    positions: dict[str, deque[int]] = {}
    for index, line in enumerate(lines):
        if not line.strip():
            positions.setdefault(line, deque()).append(index)
    removed: set[int] = set()
    index = 0
    while index < len(lines):
        if lines[index].strip():
            index += 1
        else:
            removed.add(positions[lines[index]].popleft())
            index += 2
    return [line for index, line in enumerate(lines) if index not in removed]


def _line_indent(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        lines = kept_lines(t)
        return all(_indent(b) > _indent(a) for a, b in zip(lines, lines[1:]))
    return check


def _quote_unquote(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        value = "".join(t.replace("'\"'", "").split())
        if '""' in value:
            return False
        stripped = value.strip("0123456789" + PUNCTUATION.replace('"', ""))
        return not (stripped and stripped[-1] == '"')
    return check


def _list(iid: str, kw: dict[str, Any]) -> Check:
    marker = string(iid, kw, "sep")
    return lambda t: t.count(marker) >= 2  # non-overlapping occurrences, as IFBench's re.findall


def _thesis(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        start = t.find("<i>")
        if start == -1:
            start = t.find("<em>")
            if start == -1:
                return False
        value = t[start:]
        end = value.find("</i>")
        if end == -1:
            end = value.find("</em>")
            if end == -1:
                return False
        # IFBench slices with the lengths of <i> and </i> whichever tag was found: kept as is
        return value[3:end].strip() != "" and value[end + 4:].strip() != ""
    return check


def _sub_bullets(iid: str, kw: dict[str, Any]) -> Check:
    return lambda t: all("-" in bullet for bullet in t.split("*")[1:])


def _no_bullets_bullets(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        sentences: bool | list[str] = True  # IFBench reuses this name: after a text line it holds that
        count_sentences = count_bullets = 0  # line's sentences, so a blank line ends the text part
        for line in t.split("\n"):
            if line.strip().startswith("*"):
                sentences = False
                if count_sentences < 2:
                    return False
                count_bullets += 1
            elif sentences:
                sentences = split_sentences(line.strip())
                count_sentences += len(sentences)
            else:
                return False
        return count_bullets >= 2
    return check


def _title_case(iid: str, kw: dict[str, Any]) -> Check:
    def check(t: str) -> bool:
        for word in nltk_words(t):
            if not word or not word[0].isalpha():
                continue
            if len(word) == 1:
                if word.islower():
                    return False
                continue
            if word[0].isupper() and word[1:].islower():
                continue
            if word[0].islower() and (word[1:].isupper() or word[1:].islower()):
                return False
        return True
    return check


def _output_template(iid: str, kw: dict[str, Any]) -> Check:
    return lambda t: all(part in t for part in ("My Answer:", "My Conclusion:", "Future Outlook:"))


def _no_whitespace(iid: str, kw: dict[str, Any]) -> Check:
    return lambda t: not any(char.isspace() for char in t)


def _repeat_change(iid: str, kw: dict[str, Any]) -> Check:
    prompt = string(iid, kw, "prompt_to_repeat")
    rest = " ".join(prompt.split()[1:])
    return lambda t: t != prompt and " ".join(t.split()[1:]) == rest


def _repeat_simple(iid: str, kw: dict[str, Any]) -> Check:
    return lambda t: t.strip().lower() == REPEAT_SIMPLE.lower()


def _repeat_span(iid: str, kw: dict[str, Any]) -> Check:
    prompt = string(iid, kw, "prompt_to_repeat")
    start, end = integer(iid, kw, "n_start"), integer(iid, kw, "n_end")
    span = prompt[start:end + 1].strip().lower()  # both indices inclusive here
    return lambda t: t.strip().lower() == span


REGISTRY: dict[str, Spec] = {
    "format:parentheses": Spec(_parentheses),
    "format:quotes": Spec(_quotes),
    "format:options": Spec(_options),
    "format:newline": Spec(_newline),
    "format:emoji": Spec(_emoji, slow=True),
    "format:line_indent": Spec(_line_indent),
    "format:quote_unquote": Spec(_quote_unquote),
    "format:list": Spec(_list),
    "format:thesis": Spec(_thesis),
    "format:sub-bullets": Spec(_sub_bullets),
    "format:no_bullets_bullets": Spec(_no_bullets_bullets),
    "format:title_case": Spec(_title_case, slow=True),
    "format:output_template": Spec(_output_template),
    "format:no_whitespace": Spec(_no_whitespace),
    "repeat:repeat_change": Spec(_repeat_change),
    "repeat:repeat_simple": Spec(_repeat_simple),
    "repeat:repeat_span": Spec(_repeat_span),
}
