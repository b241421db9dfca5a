"""Reading an instruction's kwargs: each check validates its arguments up front, so a bad row is a
400 naming the instruction and the argument before any text is checked."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

RELATIONS = ("less than", "at least")

Check = Callable[[str], bool]
Builder = Callable[[str, dict[str, Any]], Check]


class InstructionError(ValueError):
    """An unknown instruction id or bad kwargs; the message names the instruction and the argument."""


@dataclass(frozen=True)
class Spec:
    build: Builder
    slow: bool = False  # language detection or NLTK tokenizing: run in the worker pool


def integer(iid: str, kwargs: dict[str, Any], name: str, minimum: int = 0) -> int:
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


def string(iid: str, kwargs: dict[str, Any], name: str) -> str:
    value = kwargs.get(name)
    if not isinstance(value, str) or not value.strip():
        raise InstructionError(f"{iid}: kwarg {name!r} must be a non-empty string")
    return value


def first_string(iid: str, kwargs: dict[str, Any], name: str) -> str:
    """A string, or the first of a list of strings (open-instruct accepts both for some kwargs)."""
    value = kwargs.get(name)
    if isinstance(value, list) and value:
        return string(iid, {name: value[0]}, name)
    return string(iid, kwargs, name)


def strings(iid: str, kwargs: dict[str, Any], name: str) -> list[str]:
    value = kwargs.get(name)
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise InstructionError(f"{iid}: kwarg {name!r} must be a non-empty list of strings")
    return value


def relation(iid: str, kwargs: dict[str, Any], name: str) -> str:
    value = kwargs.get(name)
    if value not in RELATIONS:
        raise InstructionError(f"{iid}: kwarg {name!r} must be one of {list(RELATIONS)}, got {value!r}")
    return str(value)


def compare(count: int, relation: str, threshold: int) -> bool:
    return count < threshold if relation == "less than" else count >= threshold
