"""The company database's seed tables and what the toolkits share (pagination, id allocation).

The data is NeMo-Gym 0.7.0's (Apache-2.0), in `seed/`.
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

HERE = Path(__file__).resolve().parent
SEED = HERE / "seed"
NOW = pd.to_datetime("2023-11-30T23:59:00")  # "now" of every row's system prompt
# Compared case-sensitively by verification; every other column case-insensitively
CASE_SENSITIVE = ("status", "list_name", "board")


@cache
def seed_table(name: str) -> pd.DataFrame:
    """A seed table, read once per process (every session and replay starts from a copy)."""
    if name == "email_addresses":  # the directory: one address a line, no header
        return pd.read_csv(SEED / f"{name}.csv", header=None, names=["email_address"])
    return pd.read_csv(SEED / f"{name}.csv", dtype=str)


@cache
def schemas() -> list[dict[str, Any]]:
    """The Responses API function schemas of the 27 tools, as NeMo-Gym's rows carry them."""
    return json.loads((HERE / "tools.json").read_text())


def paged(records: list[dict[str, Any]], key: str, page: int, page_size: int) -> dict[str, Any]:
    """NeMo-Gym's pagination: the page is clamped into range, totals are reported."""
    total = len(records)
    pages = (total + page_size - 1) // page_size
    page = max(1, min(page, pages)) if pages > 0 else 1
    start = (page - 1) * page_size
    return {key: records[start:min(start + page_size, total)],
            "pagination": {f"total_{key}": total, "page": page, "page_size": page_size, "total_pages": pages}}


def next_id(ids: pd.Series) -> str:
    """The id of a new record: one more than the largest, eight digits."""
    return str(int(ids.max()) + 1).zfill(8)
