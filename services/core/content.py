"""Message content (a string, or a list of text parts in OpenAI/Responses style) as plain text.

One reading for every server and adapter, so a prompt or a reply means the same text to the
agent loop, the model backends, the reward model and the trainer adapters.
"""
from __future__ import annotations

import json
from typing import Any, Collection

from .errors import BadRequest

TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


def part_text(part: Any) -> str | None:
    """The text of one content part, or None when it carries none (an image, a file, ...)."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return None
    kind = part.get("type", "text")
    if isinstance(part.get("text"), str) and isinstance(kind, str) and kind in TEXT_PART_TYPES:
        return part["text"]
    if part.get("type", "refusal") == "refusal" and isinstance(part.get("refusal"), str):
        return part["refusal"]
    return None


def content_text(content: Any) -> str:
    """Lenient: parts without text are skipped, None is empty, anything else is `str()`-ed."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(t for t in map(part_text, content) if t is not None)
    return str(content)


def strict_content_text(content: Any, where: str) -> str:
    """Strict: any part without text is a 400 naming it (`where` is the message's path in the body)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            text = part_text(part)
            if text is None:
                raise BadRequest(f"{where}.content[{k}]: expected a text part {{\"type\": \"text\", \"text\": str}}")
            texts.append(text)
        return "".join(texts)
    if content is None:
        raise BadRequest(f"{where}.content: missing")
    raise BadRequest(f"{where}.content: expected a string or a list of text parts, got {type(content).__name__}")


# Fields of a content part (or of an input item) that, when present, must hold a string. A value of another
# type there would be read as text somewhere downstream (a set lookup, a join) and fail as a 500. (A function
# call's `arguments` and its output's `output` may be any JSON: model servers serialize them.)
_STRING_FIELDS = ("type", "text", "refusal", "role", "name", "call_id", "id", "status")


def part_problem(part: Any, where: str) -> str | None:
    """What is wrong with one content part (`where` is its path), or None when it is well typed."""
    if not isinstance(part, dict):
        return f"{where}: expected a content part object, got {type(part).__name__}"
    for name in _STRING_FIELDS:
        if name in part and part[name] is not None and not isinstance(part[name], str):
            return f"{where}.{name}: expected a string, got {type(part[name]).__name__}"
    if part.get("type") in TEXT_PART_TYPES and not isinstance(part.get("text"), str):
        return f"{where}.text: a {part['type']} part needs a string text"
    if "annotations" in part and not isinstance(part["annotations"], (list, type(None))):
        return f"{where}.annotations: expected a list, got {type(part['annotations']).__name__}"
    return None


def content_problem(content: Any, where: str) -> str | None:
    """What is wrong with a message's `content` (a string, null, or a list of parts), or None."""
    if content is None or isinstance(content, str):
        return None
    if not isinstance(content, list):
        return f"{where}: expected a string or a list of content parts, got {type(content).__name__}"
    for k, part in enumerate(content):
        problem = part_problem(part, f"{where}[{k}]")
        if problem:
            return problem
    return None


def item_problem(item: Any, where: str) -> str | None:
    """What is wrong with one input item (a message, a function call or its output, reasoning), or None."""
    if not isinstance(item, dict):
        return f"{where}: expected an object, got {type(item).__name__}"
    for name in _STRING_FIELDS:
        if name in item and item[name] is not None and not isinstance(item[name], str):
            return f"{where}.{name}: expected a string, got {type(item[name]).__name__}"
    if "content" in item:
        return content_problem(item["content"], f"{where}.content")
    if "summary" in item:
        return content_problem(item["summary"], f"{where}.summary")
    return None


def function_calls(output: Any, names: Collection[str]) -> list[tuple[str, dict[str, Any]]]:
    """The (name, arguments) of a response's function calls to `names`, in order; a call whose arguments
    are not a JSON object is dropped (the tool never ran it)."""
    calls = []
    for item in output:
        data = item.model_dump() if hasattr(item, "model_dump") else item
        if isinstance(data, dict) and data.get("type") == "function_call" and data.get("name") in names:
            try:
                args = json.loads(data.get("arguments") or "{}")
            except (TypeError, ValueError):
                continue
            if isinstance(args, dict):
                calls.append((data["name"], args))
    return calls
