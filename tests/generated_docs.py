"""Tables in docs/ that the tests render and keep current, between a start and an end marker."""
from __future__ import annotations

from pathlib import Path


def table_between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def write_between(page: Path, start: str, end: str, table: str) -> None:
    head, rest = page.read_text().split(start, 1)
    page.write_text(f"{head}{start}\n{table}\n{end}{rest.split(end, 1)[1]}")
