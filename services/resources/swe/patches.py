"""Unified diffs: the agent's answer out of a trajectory, and test-file changes taken out of it."""
from __future__ import annotations

import fnmatch
import json
import re
from typing import Any

from services.core.errors import BadRequest

_FENCE = re.compile(r"```(?:diff|patch)[^\n]*\n(.*?)```", re.S)
_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)", re.M)
TEST_GLOBS = ("test_*.py", "*_test.py", "tests.py", "conftest.py")
TEST_DIRS = ("tests", "test", "testing")


def from_text(text: str) -> str:
    """The last ```diff (or ```patch) block of a message, or the message itself when it is a bare git diff."""
    blocks = _FENCE.findall(text)
    if blocks:
        return blocks[-1]
    return text if text.lstrip().startswith("diff --git ") else ""


def split(diff: str) -> list[tuple[str, str]]:
    """(path, text) per file of a git diff, in order; text before the first file header is dropped."""
    starts = [m.start() for m in _FILE.finditer(diff)]
    out = []
    for i, start in enumerate(starts):
        chunk = diff[start: starts[i + 1] if i + 1 < len(starts) else len(diff)]
        m = _FILE.match(chunk)
        assert m
        out.append((m.group(2), chunk if chunk.endswith("\n") else chunk + "\n"))
    return out


def paths(diff: str) -> list[str]:
    return [path for path, _ in split(diff)]


def is_test_file(path: str, protected: set[str]) -> bool:
    parts = path.split("/")
    return (path in protected or any(p in TEST_DIRS for p in parts[:-1])
            or any(fnmatch.fnmatch(parts[-1], g) for g in TEST_GLOBS))


def without_tests(diff: str, protected: set[str]) -> tuple[str, list[str]]:
    """The diff minus every file that is a test file or touched by the test patch; and what was dropped."""
    kept, dropped = [], []
    for path, chunk in split(diff):
        (dropped if is_test_file(path, protected) else kept).append((path, chunk))
    return "".join(chunk for _, chunk in kept), [path for path, _ in dropped]


def test_list(value: Any, field: str) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS: a list of test ids, or SWE-bench's JSON string of one."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise BadRequest(f"{field}: expected a list of test ids or a JSON string of one") from None
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) and t and not t.startswith("-") for t in value):
        raise BadRequest(f"{field}: expected a list of test ids (strings not starting with '-')")
    return value
