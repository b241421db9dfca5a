"""Input text that cannot be answered: JSON strings holding lone UTF-16 surrogates.

JSON allows `"\\ud800"`, Python decodes it to a str that cannot be encoded as UTF-8, and the
reply that echoes it would fail while being written (a 500). Such a body is refused up front
with a 400 naming the field.
"""
from __future__ import annotations

import re
from typing import Any

from .errors import BadRequest

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _find(value: Any, path: str) -> str | None:
    """Path of the first string (value or key) with a lone surrogate."""
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if _SURROGATE.search(key):
                return where
            found = _find(item, where)
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _find(item, f"{path}[{i}]")
            if found:
                return found
    return None


def reject_lone_surrogates(raw: bytes, body: Any) -> None:
    """A 400 naming the field when the parsed `body` holds a lone surrogate (cheap when `raw` has no
    surrogate escape at all, the normal case: valid pairs decode to one code point)."""
    if not _SURROGATE_ESCAPE.search(raw):
        return
    where = _find(body, "")
    if where is not None:
        raise BadRequest(f"{where or 'body'}: string holds a lone UTF-16 surrogate escape (not valid Unicode)")
