"""Message content (a string, or a list of text parts in OpenAI/Responses style) as plain text.

One reading for every server and adapter, so a prompt or a reply means the same text to the
agent loop, the model backends, the reward model and the trainer adapters.
"""
from __future__ import annotations

from typing import Any

from .errors import BadRequest

TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


def part_text(part: Any) -> str | None:
    """The text of one content part, or None when it carries none (an image, a file, ...)."""
    if isinstance(part, str):
        return part
    if not isinstance(part, dict):
        return None
    if isinstance(part.get("text"), str) and part.get("type", "text") in TEXT_PART_TYPES:
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
