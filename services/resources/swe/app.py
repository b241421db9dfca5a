"""swe: SWE-bench-style repository tasks graded by their tests in a fresh sandbox.

Rows use SWE-bench's fields (`instance_id`, `repo`, `base_commit`, `problem_statement`, `patch`,
`test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`) plus where the repository comes from: a
`repo_snapshot` folder under `snapshots_dir` (the shipped tasks) or, with the docker provider, the
row's `image` whose `/testbed` holds the repository (SWE-bench's images). The agent works in a
session workspace with the shell tools. `/verify` takes the agent's diff (the session's workspace
diff read with git's configuration and attributes overridden, or without a session the last
```diff block of the answer) and grades it in a FRESH workspace (`grading.py`): applied, every
protected path put back as the task has it, `test_patch` applied, the listed tests run with results
read from pytest's own reports: reward 1 only when every FAIL_TO_PASS test passes and every
PASS_TO_PASS test still passes. What the change causes (it does not apply, breaks git, hangs, leaves
no results; a session whose diff cannot be read) is a 0, never a mask.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from pydantic import Field

from services.core.errors import BadRequest, GymError
from services.core.replies import exception_reply, scored_reply
from services.core.resource import Session, create_resource_app
from services.core.sandbox.environment import TOOL_SPECS, WorkspaceConfig, WorkspaceEnvironment, as_sandbox_failure
from services.core.sandbox.workspace import Workspace, WorkspaceError
from services.core.schemas import VerifyReply, VerifyRequest

from . import grading, patches

DATA = Path(__file__).resolve().parents[3] / "datasets" / "swe" / "repos"


class Config(WorkspaceConfig):
    snapshots_dir: Path = Field(DATA, description="folder holding the repositories rows name in repo_snapshot")
    test_timeout_s: float = Field(300.0, gt=0, le=3600, description="wall-clock limit of one test run")
    python: str = Field("python3", pattern=r"^[A-Za-z0-9_./+-]+$",
                        description="the interpreter (with pytest) that runs the tests inside the workspace")
    pytest_args: str = Field("-q -p no:cacheprovider --tb=short",
                             description="pytest options before the listed test ids (results never come from its output)")


class SweRequest(VerifyRequest):
    instance_id: str = Field(description="the task's id")
    repo: str | None = Field(None, description="the repository's name (owner/name)")
    base_commit: str | None = Field(None, description="commit checked out first when the repository is a git clone")
    repo_snapshot: str | None = Field(None, description="folder under snapshots_dir holding the repository")
    image: str | None = Field(None, description="docker provider: the task's image (repository in /testbed)")
    problem_statement: str | None = Field(None, description="the issue text")
    patch: str | None = Field(None, description="the gold patch (never applied at verify)")
    test_patch: str = Field(description="diff adding the tests that check the fix")
    FAIL_TO_PASS: list[str] | str = Field(description="tests that must pass after the fix (list or JSON string)")
    PASS_TO_PASS: list[str] | str | None = Field(None, description="tests that must keep passing")


class SweReply(VerifyReply):
    resolved: bool | None = None
    fail_to_pass_passed: float | None = None
    pass_to_pass_passed: float | None = None
    tests_status: dict[str, str] | None = None
    discarded_files: list[str] | None = None
    patch_applied: bool | None = None
    patch_source: str | None = None
    reason: str | None = None


class Swe(WorkspaceEnvironment):
    config_model = Config
    config: Config
    request_model = SweRequest
    reply_model = SweReply
    example_row = {"instance_id": "textstats-1", "repo_snapshot": "textstats",
                   "responses_create_params": {"input": [{"role": "user", "content": "word_count miscounts."}],
                                               "tools": TOOL_SPECS},
                   "test_patch": "", "FAIL_TO_PASS": ["tests/test_words.py::test_many_spaces"], "PASS_TO_PASS": []}
    example_answer = "```diff\n...\n```"
    description = "SWE-bench-style repository tasks; reward 1 when the FAIL_TO_PASS tests pass and none of PASS_TO_PASS breaks."

    def source(self, body: dict[str, Any]) -> tuple[str | None, Path | None]:
        snap = body.get("repo_snapshot")
        image = body.get("image") if self.config.sandbox_provider == "docker" else None
        if snap is None:
            if image is None:
                raise BadRequest("repo_snapshot: required (a folder under snapshots_dir) unless the docker "
                                 "provider runs the row's image")
            return image, None
        if not isinstance(snap, str) or not snap or snap.startswith("/") or ".." in Path(snap).parts:
            raise BadRequest("repo_snapshot: expected a folder name under snapshots_dir")
        folder = (self.config.snapshots_dir / snap).resolve()
        if not folder.is_dir() or self.config.snapshots_dir.resolve() not in folder.parents:
            raise BadRequest(f"repo_snapshot: no repository {snap!r} under snapshots_dir")
        return image, folder

    async def fresh(self, body: dict[str, Any], *, pooled: bool = True) -> Workspace:
        ws = await super().fresh(body, pooled=pooled)
        commit = body.get("base_commit")
        if isinstance(commit, str) and re.fullmatch(r"[0-9a-fA-F]{7,40}", commit):
            try:
                out = await ws.exec(f"git rev-parse -q --verify {commit}^{{commit}} >/dev/null && git checkout -q {commit}")
                if out.exit_code == 0:
                    await ws.init_base()
            except BaseException:
                await ws.destroy()
                raise
        return ws

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        row = request.model_dump()
        f2p = patches.test_list(row.get("FAIL_TO_PASS"), "FAIL_TO_PASS")
        p2p = patches.test_list(row.get("PASS_TO_PASS"), "PASS_TO_PASS")
        if not f2p:
            raise BadRequest("FAIL_TO_PASS: at least one test id is needed")
        test_patch = row.get("test_patch")
        if not isinstance(test_patch, str):
            raise BadRequest("test_patch: expected a diff (may be empty)")
        self.source(row)
        live = session.data.get("workspace") if session else None
        try:
            if live is not None:
                origin = "session"
                got = await live.diff_result()
                if got.exit_code != 0:  # the policy's workspace: its .git, its files, its diff's size
                    return scored_reply(request, 0.0, resolved=False, patch_applied=False, patch_source=origin,
                                        reason="the session's change could not be read: "
                                               f"{(got.stderr or got.stdout or 'output over the cap').strip()[-300:]}")
                diff = got.stdout
            else:
                diff, origin = patches.from_text(request.text()), "answer"
            task_tests = {p for names, _ in patches.split(test_patch) for p in names}
            diff, dropped = patches.without_tests(diff, task_tests)
            if not diff.strip():
                return scored_reply(request, 0.0, resolved=False, patch_applied=False, patch_source=origin,
                                    discarded_files=dropped, reason="empty patch (after test files were dropped)")
            return await self._grade(request, row, diff, dropped, origin, test_patch, task_tests, f2p, p2p)
        except (WorkspaceError, GymError) as exc:
            if isinstance(exc, BadRequest):
                raise
            return exception_reply(request, as_sandbox_failure(exc), model=SweReply)

    async def _grade(self, request: VerifyRequest, row: dict[str, Any], diff: str, dropped: list[str], origin: str,
                     test_patch: str, task_tests: set[str], f2p: list[str], p2p: list[str]) -> VerifyReply:
        common: dict[str, Any] = {"patch_source": origin, "discarded_files": dropped}
        token = grading.new_token()
        ws = await self.fresh(row, pooled=False)
        try:
            applied = await ws.apply_patch(diff)
            if applied.exit_code != 0:
                return scored_reply(request, 0.0, resolved=False, patch_applied=False, **common,
                                    reason=f"the patch does not apply: {applied.stderr.strip()[-300:]}")
            if test_patch.strip():
                task_tests |= set(await grading.numstat_paths(ws, test_patch))
            prepared = await grading.restore_protected(ws, task_tests)
            common["discarded_files"] = list(dict.fromkeys([*dropped, *prepared.restored]))
            if prepared.failure is not None:
                return scored_reply(request, 0.0, resolved=False, patch_applied=True, **common,
                                    reason=prepared.failure)
            if not prepared.kept:
                return scored_reply(request, 0.0, resolved=False, patch_applied=True, **common,
                                    reason="empty patch (after test files were restored)")
            if test_patch.strip():
                tests = await ws.apply_patch(test_patch)
                if tests.exit_code != 0:
                    raise BadRequest(f"test_patch: does not apply to the repository: {tests.stderr.strip()[-300:]}")
            run = await ws.exec(grading.run_command(self.config.python, self.config.pytest_args, [*f2p, *p2p], token),
                                timeout_s=self.config.test_timeout_s)
        finally:
            await ws.destroy()
        results, tail = grading.read_results(run.stdout, token)
        reported = results["tests"] if results else {}
        status = {test: grading.outcome(reported[test]) if test in reported else "FAILED" for test in [*f2p, *p2p]}
        if run.timed_out:
            status = {t: ("TIMEOUT" if s == "FAILED" else s) for t, s in status.items()}
        ok = {t for t, s in status.items() if s in ("PASSED", "XFAIL")}
        f2p_rate = sum(t in ok for t in f2p) / len(f2p)
        p2p_rate = sum(t in ok for t in p2p) / len(p2p) if p2p else 1.0
        resolved = f2p_rate == 1.0 and p2p_rate == 1.0
        reason = None if results else ("the test run timed out" if run.timed_out
                                       else f"the test run left no results: {tail.strip()[-300:]}")
        return scored_reply(request, 1.0 if resolved else 0.0, resolved=resolved, fail_to_pass_passed=f2p_rate,
                            pass_to_pass_passed=p2p_rate, tests_status=status, patch_applied=True, reason=reason,
                            **common)


def build(config: Config) -> FastAPI:
    return create_resource_app(Swe(config))
