"""Grading a change where nothing the policy wrote decides what is collected or how results are read.

In a fresh workspace (its git repository made by us, never seen by the policy):
1. the change is applied with `git apply` (git's own parser: quoted paths, renames, copies, modes);
2. git lists every path that now differs from the task (`--no-renames`, NUL-separated), and each
   protected one (`patches.is_protected`: tests, conftest, pytest/tox/setup configs, start-up
   hooks, package metadata, runner look-alikes, whatever `test_patch` touches) is put back as the
   task has it, by resetting the index and the work tree to a commit of the allowed changes only;
3. `test_patch` is applied and the listed tests run under `RUNNER`: an isolated interpreter
   (`-I`: no PYTHON* variables, no user site, the repository not on the path until pytest itself is
   imported), the rootdir pinned, and outcomes recorded by an in-memory pytest plugin from pytest's
   own reports into a file outside the repository, printed between markers only after pytest has
   returned. Nothing the tests print is read as a result: stdout and stderr go to a file of which
   only a tail is shown.

Every failure after the change is applied is caused by the change (it does not apply, git cannot
stage it, the tests crash or hang, no results come back): a 0 with a reason, never a mask. Only
the sandbox failing to start or run is an infrastructure failure.
"""
from __future__ import annotations

import dataclasses
import json
import secrets
import shlex
from typing import Any

from services.core.sandbox.workspace import GIT, Workspace

from . import patches

# argv: results path, then pytest's arguments; the repository joins sys.path only after pytest and
# its plugins are imported, so no file of it can stand in for them
RUNNER = r'''
import json, sys
import pytest
results = {}
wanted = set(sys.argv[2:])
class _GymReport:
    def pytest_runtest_logreport(self, report):
        if report.nodeid not in wanted:
            return
        r = results.setdefault(report.nodeid, {})
        r[report.when] = report.outcome
        if hasattr(report, "wasxfail"):
            r["xfail"] = True
sys.path.insert(0, "/workspace")
code = pytest.main(sys.argv[2:], plugins=[_GymReport()])
with open(sys.argv[1], "w") as f:
    json.dump({"exit": int(code), "tests": results}, f)
'''
OUTPUT_TAIL = 2000


@dataclasses.dataclass
class Prepared:
    """The patched tree's state: which changed paths were put back, and why it stopped if it did."""

    restored: list[str]
    kept: list[str]
    failure: str | None = None


def _nul_list(text: str) -> list[str]:
    return [p for p in text.split("\0") if p]


async def numstat_paths(ws: Workspace, diff: str) -> list[str]:
    """Every path a diff names, by git's own parser (old and new side of renames and copies)."""
    out = await ws.exec(f"{GIT} apply --numstat -z -", stdin=diff.encode())
    if out.exit_code != 0:
        return []
    paths: list[str] = []
    fields = out.stdout.split("\0")
    i = 0
    while i < len(fields):
        field = fields[i]
        if not field:
            i += 1
            continue
        cols = field.split("\t", 2)
        if len(cols) == 3 and cols[2]:
            paths.append(cols[2])
            i += 1
        else:  # a rename or copy: "added\tdeleted\t" then the two paths as their own fields
            paths += [p for p in fields[i + 1:i + 3] if p]
            i += 3
    return paths


async def restore_protected(ws: Workspace, task_tests: set[str]) -> Prepared:
    """After the change is applied: put every protected changed path back as the task has it."""
    assert ws.base is not None
    staged = await ws.exec(f"{GIT} add -A . && {GIT} diff --cached --name-only -z --no-renames {shlex.quote(ws.base)}")
    if staged.exit_code != 0 or staged.output_exceeded:
        return Prepared([], [], f"git cannot stage the patched tree: {(staged.stderr or staged.stdout)[-300:]}")
    changed = _nul_list(staged.stdout)
    restored = [p for p in changed if patches.is_protected(p, task_tests)]
    kept = [p for p in changed if p not in set(restored)]
    if restored:
        spec = "".join(p + "\0" for p in restored).encode()
        reset = await ws.exec(f"{GIT} --literal-pathspecs reset -q {shlex.quote(ws.base)} "
                              "--pathspec-from-file=- --pathspec-file-nul", stdin=spec)
        if reset.exit_code != 0:
            return Prepared(restored, kept, f"git cannot restore the task's files: {reset.stderr[-300:]}")
    # the work tree becomes exactly the allowed change: untracked leftovers (ignored ones too) go
    done = await ws.exec(f"{GIT} commit -q --allow-empty --no-verify -m graded && {GIT} reset -q --hard HEAD "
                         f"&& {GIT} clean -ffdxq")
    if done.exit_code != 0:
        return Prepared(restored, kept, f"git cannot check out the graded tree: {(done.stderr or done.stdout)[-300:]}")
    return Prepared(restored, kept)


def run_command(python: str, pytest_args: str, ids: list[str], token: str) -> str:
    """The test run, its results file and the markers around what the grader reads."""
    results, output = f"/tmp/gymserve-results-{token}.json", f"/tmp/gymserve-output-{token}.txt"
    args = " ".join(shlex.quote(t) for t in ids)
    return (f"{python} -I -c {shlex.quote(RUNNER)} {results} --rootdir=/workspace {pytest_args} {args} "
            f"</dev/null >{output} 2>&1; printf '\\n{token}-results\\n'; cat {results} 2>/dev/null; "
            f"printf '\\n{token}-output\\n'; tail -c {OUTPUT_TAIL} {output}")


def new_token() -> str:
    return "gymserve-" + secrets.token_hex(16)


def read_results(stdout: str, token: str) -> tuple[dict[str, Any] | None, str]:
    """(results, output tail) from a run's stdout; results None when the run left none."""
    start, mid = f"\n{token}-results\n", f"\n{token}-output\n"
    if start not in stdout or mid not in stdout:
        return None, stdout[-OUTPUT_TAIL:]
    body = stdout[stdout.rindex(start) + len(start):]
    data, tail = body.split(mid, 1) if mid in body else (body, "")
    try:
        parsed = json.loads(data) if data.strip() else None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("tests"), dict):
        return None, tail
    return parsed, tail


def outcome(phases: Any) -> str:
    """One test's status from pytest's per-phase reports."""
    if not isinstance(phases, dict):
        return "FAILED"
    values = [phases.get(k) for k in ("setup", "call", "teardown")]
    if phases.get("setup") == "failed" or phases.get("teardown") == "failed":
        return "ERROR"
    if phases.get("call") == "failed":
        return "FAILED"
    if phases.get("call") == "passed":
        return "XPASS" if phases.get("xfail") else "PASSED"
    if "skipped" in values:
        return "XFAIL" if phases.get("xfail") else "SKIPPED"
    return "FAILED"
