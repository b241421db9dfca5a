"""Unified diffs: the agent's answer out of a trajectory, and which paths a grader must keep as the task has them.

Two layers, for two jobs. `without_tests` drops the test-file sections of an answer's diff before
it is applied (a courtesy: a hunk against a test the task will replace need not make the whole
patch fail). It reads git's headers properly (C-quoted paths, `rename from/to`, `copy from/to`,
`---`/`+++` lines), but it is NOT what keeps the tests honest: the grader applies the change, asks
git which paths changed in the patched tree, and restores every `protected` one from the task
(`services/resources/swe/grading.py`). A header the parser here misreads can therefore cost a
patch its courtesy, never let a changed test, conftest, pytest config or plugin be graded.
"""
from __future__ import annotations

import fnmatch
import json
import re
from typing import Any

from services.core.errors import BadRequest

_FENCE = re.compile(r"```(?:diff|patch)[^\n]*\n(.*?)```", re.S)
_GIT_HEADER = re.compile(r"^diff --git ", re.M)
TEST_GLOBS = ("test_*.py", "*_test.py", "tests.py", "conftest.py")
TEST_DIRS = ("tests", "test", "testing")
# files that decide what pytest collects, how, and with which plugins; wherever they are in the tree
CONFIG_NAMES = ("conftest.py", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg",
                "sitecustomize.py", "usercustomize.py", ".gitattributes")
# top-level names that would shadow the test runner itself if the repository were first on sys.path
RUNNER_NAMES = ("pytest", "_pytest", "pluggy", "py", "iniconfig")
# package metadata a path entry can carry (pytest11 entry points, .pth start-up code)
METADATA_SUFFIXES = (".dist-info", ".egg-info", ".egg-link", ".pth")
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def from_text(text: str) -> str:
    """The last ```diff (or ```patch) block of a message, or the message itself when it is a bare git diff."""
    blocks = _FENCE.findall(text)
    if blocks:
        return blocks[-1]
    return text if text.lstrip().startswith("diff --git ") else ""


def unquote(token: str) -> str:
    """A path as git writes it: bare, or C-quoted ("a/\\303\\251 x") with octal bytes and escapes."""
    if not (len(token) >= 2 and token[0] == '"' and token[-1] == '"'):
        return token
    out = bytearray()
    body, i = token[1:-1], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\" or i + 1 == len(body):
            out += ch.encode("utf-8", "surrogateescape")
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in "01234567" and re.fullmatch(r"[0-7]{3}", body[i + 1:i + 4]):
            out.append(int(body[i + 1:i + 4], 8) & 0xFF)
            i += 4
        else:
            out.append(_ESCAPES.get(nxt, ord(nxt) if ord(nxt) < 128 else 63))
            i += 2
    return out.decode("utf-8", "replace")


def _strip_prefix(path: str) -> str | None:
    if path == "/dev/null":
        return None
    return path.split("/", 1)[1] if "/" in path else path


def _header_pair(line: str) -> list[str]:
    """Both paths of a `diff --git A B` line, each quoted or bare (bare paths may hold spaces: split
    where the second starts with the same prefix letter)."""
    rest = line[len("diff --git "):].rstrip("\n")
    if rest.startswith('"'):
        end = _quoted_end(rest)
        first, second = rest[:end + 1], rest[end + 1:].lstrip(" ")
        return [p for p in (_strip_prefix(unquote(first)), _strip_prefix(unquote(second))) if p]
    if rest.endswith('"'):
        start = rest.rfind(' "')
        first, second = rest[:start], rest[start + 1:]
        return [p for p in (_strip_prefix(first), _strip_prefix(unquote(second))) if p]
    half = len(rest) // 2  # `a/X b/X`: without a rename both halves name the same file
    if rest[half] == " " and rest[:half].split("/", 1)[-1] == rest[half + 1:].split("/", 1)[-1]:
        return [p for p in (_strip_prefix(rest[:half]), _strip_prefix(rest[half + 1:])) if p]
    return [p for p in (_strip_prefix(tok) for tok in rest.split(" ")) if p]


def _quoted_end(text: str) -> int:
    i = 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == '"':
            return i
        i += 1
    return len(text) - 1


def section_paths(chunk: str) -> list[str]:
    """Every path one file section of a git diff names: the header pair, rename/copy from/to, ---/+++."""
    lines = chunk.splitlines()
    found = _header_pair(lines[0]) if lines else []
    for line in lines[1:]:
        if line.startswith("@@") or line.startswith("GIT binary patch"):
            break
        for key in ("rename from ", "rename to ", "copy from ", "copy to "):
            if line.startswith(key):
                found.append(unquote(line[len(key):]))
        for key in ("--- ", "+++ "):
            if line.startswith(key):
                path = _strip_prefix(unquote(line[len(key):].split("\t")[0]))
                if path:
                    found.append(path)
    return list(dict.fromkeys(found))


def split(diff: str) -> list[tuple[list[str], str]]:
    """(paths, text) per file section of a git diff, in order; text before the first header is dropped."""
    starts = [m.start() for m in _GIT_HEADER.finditer(diff)]
    out = []
    for i, start in enumerate(starts):
        chunk = diff[start: starts[i + 1] if i + 1 < len(starts) else len(diff)]
        out.append((section_paths(chunk), chunk if chunk.endswith("\n") else chunk + "\n"))
    return out


def is_protected(path: str, task_tests: set[str]) -> bool:
    """Whether `path` is graded as the task has it: a test file or folder, anything the test patch
    touches, a pytest configuration or conftest anywhere, start-up hooks, package metadata, or a
    module that would stand in for the test runner."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return True
    name = parts[-1]
    return (path in task_tests
            or any(p in TEST_DIRS for p in parts)
            or any(fnmatch.fnmatch(name, g) for g in TEST_GLOBS)
            or name in CONFIG_NAMES
            or parts[0].removesuffix(".py") in RUNNER_NAMES
            or any(p.endswith(METADATA_SUFFIXES) for p in parts))


def without_tests(diff: str, task_tests: set[str]) -> tuple[str, list[str]]:
    """The diff minus every file section that names a protected path; and those paths."""
    kept, dropped = [], []
    for names, chunk in split(diff):
        hit = [p for p in names if is_protected(p, task_tests)]
        if hit or not names:
            dropped += hit
        else:
            kept.append(chunk)
    return "".join(kept), list(dict.fromkeys(dropped))


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
