"""docs/nemo-gym-compat.md carries the table tests/compat/compat_page.py renders, and every test it names exists."""
from __future__ import annotations

import os
from pathlib import Path

from tests.compat import compat_page

ROOT = Path(__file__).resolve().parents[2]


def test_compat_page_is_current():
    if os.environ.get("GYMSERVE_WRITE_COMPAT") == "1":
        compat_page.write_page()
    assert compat_page.page_table(compat_page.PAGE.read_text()) == compat_page.render(), (
        "docs/nemo-gym-compat.md is stale: rerun with GYMSERVE_WRITE_COMPAT=1")


def test_every_row_names_existing_tests_and_counted_rows_are_counted():
    for what, _, tests, key in compat_page.ROWS:
        for path in tests.split(", "):
            assert (ROOT / path.strip("`")).is_file(), f"{what}: {path} does not exist"
        if key is not None:
            assert key in compat_page.COUNTS
            source = "".join((ROOT / p.strip("`")).read_text() for p in tests.split(", "))
            assert f'compared("{key}"' in source, f"{what}: its test never reports the count it compared"
