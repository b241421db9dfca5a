"""code: runs model-written Python in a bubblewrap sandbox, to verify solutions and as a REPL tool.

`/verify` runs the response's last ```python block against the row's `tests`
([{input, output}] on stdin/stdout) or `test_code` (asserts, optional `entry_point`);
`POST /execute_python {"code"}` is a per-session persistent interpreter. Sandbox and
limits: see sandbox.py and this folder's README.md (section "Sandbox").

Why no core WorkerPool here: every execution already is its own killable process with a
hard wall clock, driven by asyncio subprocess pipes; a pool worker would only be a
middleman. Concurrency is bounded by a semaphore and a bounded wait queue instead: one
for the sandboxes (a `/verify` row's, all its tests in one; an execute_python call's) and
one for the test runs inside them.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from typing import Any, Literal

from fastapi import FastAPI
from pydantic import Field

from services.core.errors import BadRequest, Conflict, Unavailable
from services.core.failures import FailureKind
from services.core.replies import MAX_REASON_CHARS, failed_reply, scored_reply
from services.core.resource import Environment, ResourceConfig, Session, create_resource_app, tool
from services.core.schemas import VerifyReply, VerifyRequest

from . import nemo_rows
from . import verify as judge
from .repl import Repl, ReplClosed
from .sandbox import Limits, Sandbox, SandboxError

log = logging.getLogger("gymserve.code")


class Config(ResourceConfig):
    use_pool: bool = Field(False, description="unused: executions are sandboxed subprocesses")
    sandbox: Literal["bwrap", "unsafe"] = Field(
        "bwrap", description="bwrap = bubblewrap isolation, probed at start-up (refuses to start if it fails); "
                             "unsafe = plain subprocesses with rlimits only (explicit opt-in, reported everywhere)")
    bwrap_path: str = Field("bwrap", description="bubblewrap executable")
    seccomp: bool = Field(True, description="load the seccomp filter (ptrace, non-Unix sockets, namespaces... denied)")
    pids_cgroup: bool = Field(True, description="per-execution pids + memory cgroups when running as root")
    timeout_s: float = Field(5.0, gt=0, le=300, description="wall-clock limit of one test run")
    cpu_s: float | None = Field(None, gt=0, description="CPU-time limit of one test run (default: timeout_s)")
    memory_mb: int = Field(512, ge=32, description="address-space limit of one process")
    sandbox_memory_mb: int = Field(0, ge=0, description="memory of a whole sandbox, all its processes together "
                                                         "(memory cgroup, where available); 0 = 2 x memory_mb")
    file_mb: int = Field(16, ge=1, description="largest file a program may write")
    tmp_mb: int = Field(64, ge=1, description="size of the sandbox's private /tmp")
    max_processes: int = Field(32, ge=1, description="processes/threads one run may have")
    max_output_bytes: int = Field(65536, ge=1024, description="stdout/stderr cut (and the run killed) beyond this")
    max_concurrency: int = Field(0, ge=0, description="sandboxes, and test runs in them, running at once; "
                                                      "0 = 2 x CPU cores")
    max_pending: int = Field(512, ge=0, description="rows (or execute_python calls) waiting for a sandbox; "
                                                    "beyond this: 503")
    prestart: int = Field(4, ge=0, description="sandboxes kept started and waiting for a program (0 = none)")
    tests_parallel: int = Field(4, ge=1, description="tests of one program run in parallel (in its one "
                                                     "sandbox) up to this")
    max_tests: int = Field(256, ge=1, description="largest test list accepted")
    reward_mode: Literal["fraction", "all"] = Field("fraction", description="fraction of tests passed, or 1/0")
    repl_timeout_s: float = Field(10.0, gt=0, le=600, description="wall-clock limit of one execute_python call")
    repl_cpu_s: float = Field(300.0, gt=0, description="CPU-time budget of one session's interpreter")
    max_sessions: int = Field(256, ge=1, description="open tool sessions (one interpreter each); beyond: 429")
    terminate_on_evaluation: bool = Field(
        False, description="execute_python replies terminated=true when the last line is an expression that "
                           "evaluated (NeMo RL code environment semantics); a seeded row may override it")


class Gate:
    """At most `limit` executions at once, at most `pending` waiting; more is a 503 (client retries)."""

    def __init__(self, limit: int, pending: int) -> None:
        self.sem = asyncio.Semaphore(limit)
        self.limit = limit
        self.pending = pending
        self.waiting = 0

    async def acquire(self) -> None:
        if self.sem.locked() and self.waiting >= self.pending:
            raise Unavailable(f"code sandbox overloaded: {self.limit} running and {self.waiting} queued "
                              f"(max_pending={self.pending}); retry later")
        self.waiting += 1
        try:
            await self.sem.acquire()
        finally:
            self.waiting -= 1

    def release(self) -> None:
        self.sem.release()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: Any) -> None:
        self.release()


class Lanes:
    """Admission of one row's test runs: at most `parallel` of the row at once, and a slot of the shared gate."""

    def __init__(self, parallel: int, gate: Gate) -> None:
        self.lane = asyncio.Semaphore(parallel)
        self.gate = gate

    async def acquire(self) -> None:
        await self.lane.acquire()
        try:
            await self.gate.acquire()
        except BaseException:
            self.lane.release()
            raise

    def release(self) -> None:
        self.gate.release()
        self.lane.release()


class CodeRequest(VerifyRequest):
    tests: list[dict[str, Any]] | None = Field(None, description="[{input, output}]: stdin and expected stdout")
    test_code: str | None = Field(None, description="assert-based tests run after the program (instead of tests)")
    entry_point: str | None = Field(None, description="function the test_code calls")
    reward_mode: Literal["fraction", "all"] | None = Field(None, description="overrides the server's reward_mode")


class CodeReply(VerifyReply):
    tests_passed: int | None = None
    tests_total: int | None = None
    test_results: list[dict[str, Any]] | None = Field(None, description="per test: passed, failure_kind, exit_code...")
    sandbox: str | None = Field(None, description="bwrap or unsafe")


class CodeEnv(Environment):
    config_model = Config
    request_model = CodeRequest
    reply_model = CodeReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "Print a + b."}]},
                   "tests": [{"input": "1 2\n", "output": "3\n"}]}
    example_answer = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    description = "Runs Python in a bubblewrap sandbox: tests-based /verify and a persistent execute_python tool."
    config: Config

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.sandbox = Sandbox(config.sandbox, bwrap=config.bwrap_path, seccomp=config.seccomp,
                               pids_cgroup=config.pids_cgroup)
        limit = config.max_concurrency or 2 * (os.cpu_count() or 1)
        self.gate = Gate(limit, config.max_pending)  # test runs and execute_python calls
        self.rows = Gate(limit, config.max_pending)  # /verify rows, one sandbox each
        self.test_limits = Limits(
            wall_s=config.timeout_s, cpu_s=config.cpu_s or config.timeout_s, memory_mb=config.memory_mb,
            file_mb=config.file_mb, processes=config.max_processes, output_bytes=config.max_output_bytes,
            tmp_mb=config.tmp_mb, total_memory_mb=config.sandbox_memory_mb)
        self.repl_limits = Limits(
            wall_s=config.repl_timeout_s, cpu_s=config.repl_cpu_s, memory_mb=config.memory_mb,
            file_mb=max(config.file_mb, (2 * config.max_output_bytes >> 20) + 1), processes=config.max_processes,
            output_bytes=config.max_output_bytes, tmp_mb=config.tmp_mb, total_memory_mb=config.sandbox_memory_mb)

    async def startup(self) -> None:
        await super().startup()
        try:
            await self.sandbox.start()
        except SandboxError as exc:
            log.error("refusing to start: %s", exc)
            raise SystemExit(f"resources/code: {exc}") from None
        await self.sandbox.prestart(self.test_limits, self.config.prestart, parallel=self.config.tests_parallel)
        log.info("code sandbox: %s", self.sandbox.describe())

    async def shutdown(self) -> None:
        await super().shutdown()
        await self.sandbox.close()

    def ready_details(self) -> dict[str, Any]:
        return self.sandbox.describe()

    # ---- verification -------------------------------------------------------- #
    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        row = request.model_extra or {}
        if nemo_rows.is_nemo_row(row):
            return await self.verify_nemo_row(request, row)
        _, tests, test_code, entry = judge.parse_tests(row, self.config.max_tests)
        mode = row.get("reward_mode", self.config.reward_mode)
        if mode not in ("fraction", "all"):
            raise BadRequest("reward_mode: expected 'fraction' or 'all'")
        program = judge.extract_program(request.text())
        return await self.run_cases(request, judge.plan(program, tests, test_code, entry), mode)

    async def verify_nemo_row(self, request: VerifyRequest, row: dict[str, Any]) -> VerifyReply:
        """A NeMo-Gym code_gen row: its extraction, comparison and all-or-nothing reward (nemo_rows.py)."""
        tests = nemo_rows.parse_unit_tests(row, self.config.max_tests)
        text = request.text()
        program = nemo_rows.extract_code(text)
        if not text.strip() or not program or nemo_rows.has_think_tag(text):
            return scored_reply(request, 0.0, tests_passed=0, tests_total=len(tests), sandbox=self.sandbox.mode)
        return await self.run_cases(request, judge.plan(program, tests, None, None), "all", nemo_rows.outputs_match)

    async def run_cases(self, request: VerifyRequest, cases: list[judge.Case], mode: str,
                    match: Callable[[str, str], bool] = judge.outputs_match) -> VerifyReply:
        """All the row's tests in one sandbox, up to tests_parallel at once (runner.BATCH)."""
        extra: dict[str, Any] = {"sandbox": self.sandbox.mode}
        runs = [(c.program, c.stdin.encode("utf-8", "surrogatepass")) for c in cases]
        async with self.rows:
            try:
                results = await self.sandbox.run_batch(runs, self.test_limits, self.config.tests_parallel,
                                                       Lanes(self.config.tests_parallel, self.gate))
            except SandboxError as exc:
                log.error("sandbox failure during verify: %s", exc)
                return failed_reply(request, FailureKind.SANDBOX, str(exc), tests_total=len(cases), **extra)
        outcomes = [judge.classify(c, r, self.test_limits.cpu_s, match) for c, r in zip(cases, results)]
        passed = sum(1 for o in outcomes if o["passed"])
        return scored_reply(request, judge.reward(outcomes, mode), tests_passed=passed,
                           tests_total=len(outcomes), test_results=outcomes, **extra)

    # ---- tool mode ------------------------------------------------------------ #
    async def seed(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        flag = body.get("terminate_on_evaluation", self.config.terminate_on_evaluation)
        if not isinstance(flag, bool):
            raise BadRequest("terminate_on_evaluation: expected true or false")
        session.data["terminate_on_evaluation"] = flag
        return {"sandbox": self.sandbox.mode, "terminate_on_evaluation": flag}

    def tool_parameters(self, name: str, fn: Any) -> dict[str, Any]:
        return {"type": "object", "required": ["code"], "additionalProperties": False,
                "properties": {"code": {"type": "string", "description": "Python source to run"}}}

    async def release(self, session: Session) -> None:
        repl = session.data.pop("repl", None)
        if repl is not None:
            await repl.close(final=True)

    @tool
    async def execute_python(self, session: Session, code: Any = None) -> dict[str, Any]:
        """Run `code` in this session's persistent sandboxed interpreter (state kept between calls)."""
        if not isinstance(code, str):
            raise BadRequest("execute_python: 'code' must be a string of Python source")
        if len(code.encode()) > self.config.max_body_bytes:
            raise BadRequest("execute_python: code too large")
        repl = session.data.get("repl")
        if repl is None:
            repl = session.data["repl"] = Repl(self.sandbox, self.repl_limits)
        async with self.gate:
            try:
                reply = await repl.execute(code, self.config.repl_timeout_s)
            except ReplClosed:
                raise Conflict("execute_python: the session was closed during the call") from None
            except SandboxError as exc:
                log.error("sandbox failure in execute_python: %s", exc)
                return {"stdout": "", "stderr": "", "exit_code": None, "timed_out": False, "result": None,
                        "truncated": False, "terminated": False, "state_lost": True, "sandbox": self.sandbox.mode,
                        "mask_sample": True, "failure_kind": str(FailureKind.SANDBOX),
                        "failure_reason": str(exc)[:MAX_REASON_CHARS]}
        terminate = bool(session.data.get("terminate_on_evaluation"))
        reply["terminated"] = terminate and reply.pop("evaluated", False) and reply["exit_code"] == 0
        reply.pop("evaluated", None)
        reply["sandbox"] = self.sandbox.mode
        return reply


def build(config: Config) -> FastAPI:
    return create_resource_app(CodeEnv(config))
