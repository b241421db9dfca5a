"""docs/trainer-compat.md carries the table the tests' rows render (tests/integration/compat_table.py)."""
from __future__ import annotations

import os
from pathlib import Path

from tests.integration import compat_table

ROOT = Path(__file__).resolve().parents[2]


def test_compat_table_is_current():
    if os.environ.get("GYMSERVE_WRITE_COMPAT") == "1":
        compat_table.write_page()
    assert compat_table.page_table(compat_table.PAGE.read_text()) == compat_table.render(), (
        "docs/trainer-compat.md is stale: rerun with GYMSERVE_WRITE_COMPAT=1")


def test_every_row_names_an_existing_test():
    for row in compat_table.rows():
        for path in row["proven by"].split(", "):
            assert (ROOT / path.strip("`")).is_file(), f"{row['framework']}: {path} does not exist"
