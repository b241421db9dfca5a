"""Runs untrusted Python in a bubblewrap sandbox, asynchronously, with hard limits.

Each execution is `bwrap ... python -I -S -c RUNNER limits...` (runner.py): one program (`run`), or
all the tests of one /verify row (`run_batch`: starting a sandbox costs far more than running a test
in it), with the bwrap command line from services/core/sandbox/bwrap.py (what it promises is listed
there and in docs/security-sandbox.md):
- never root outside: as root, bwrap is started as uid 65534 (cgroups joined first), so the user
  namespace maps the sandbox user onto 65534; the start-up probe refuses to serve otherwise, or
  when a global sysctl opens for writing inside;
- file system: a fresh read-only root holding only /usr (+ the /bin, /lib* links or dirs), the
  interpreter's own prefix, numpy/sympy/mpmath read-only, read-only /proc/sys and /dev, and the
  writable tmpfs /tmp and /dev/shm sharing `tmp_mb`; the program arrives on stdin
  (length-prefixed, ahead of the test's input), so sandboxes can be pre-started. Nothing of the
  repository, the home directory or /etc is visible;
- environment: bwrap itself starts from a minimal environment and the child gets `--clearenv` plus
  PATH/HOME/LANG only, so no secret of the server (GYMSERVE_API_KEY...) is anywhere inside;
- rlimits (CPU, address space, file size, processes, open files, no core) set by the runner,
  pids + memory cgroups per execution when the server may create them, an optional seccomp
  filter, a wall-clock kill, and stdout/stderr read incrementally and cut at a byte limit.
`--die-with-parent` + the pid namespace mean killing bwrap kills every process the code started.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, Protocol, Sequence

from services.core.sandbox.bwrap import (INSIDE_PATH, PROBE, SANDBOX_UID, Bind, bwrap_argv, host_uids,
                                         package_binds, parse_probe, probe_problems, reachable_by, spawn_uid,
                                         unprivileged)

from . import runner
from services.core.sandbox.cgroup import Cgroups
from services.core.sandbox.seccomp import build_filter

log = logging.getLogger("gymserve.code")
# how long a sandbox that has answered everything gets to exit by itself before it is killed
_EXIT_GRACE_S = 1.0

Mode = Literal["bwrap", "unsafe"]


class SandboxError(Exception):
    """The sandbox itself failed (not the program): an infrastructure failure."""


@dataclasses.dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    file_mb: int = 16
    processes: int = 32
    open_files: int = 256
    output_bytes: int = 65536
    tmp_mb: int = 64
    total_memory_mb: int = 0  # whole sandbox (memory cgroup); 0 = 2 x memory_mb

    def runner_args(self) -> list[str]:
        return [str(int(math.ceil(self.cpu_s)) + 1), str(self.memory_mb << 20), str(self.file_mb << 20),
                str(self.processes), str(self.open_files)]

    def batch(self, parallel: int) -> "Limits":
        """What a sandbox running up to `parallel` test cases with these limits each is started with:
        `parallel` times the processes, /tmp and sandbox memory (plus one process, the runner). A row
        with fewer cases gets its share back in `Sandbox.run_batch` (cgroup and RLIMIT_NPROC lowered)."""
        return dataclasses.replace(self, processes=self.processes * parallel + 1, tmp_mb=self.tmp_mb * parallel,
                                   total_memory_mb=(self.total_memory_mb or 2 * self.memory_mb) * parallel)


@dataclasses.dataclass
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool = False
    output_exceeded: bool = False
    sandbox_error: str | None = None
    wall_s: float = 0.0
    oom_killed: bool = False

    @property
    def signal(self) -> int | None:
        return self.exit_code - 128 if self.exit_code is not None and self.exit_code > 128 else None


class Slot(Protocol):
    """Admission of one test case (the server's gate): held from sending the case to its result."""

    async def acquire(self) -> None: ...

    def release(self) -> None: ...


class _FreshSandboxFailed(SandboxError):
    """A pre-started sandbox failed before answering anything (retried once with a fresh one)."""


@dataclasses.dataclass
class Spawned:
    """A running sandboxed process and what must be cleaned up after it."""

    proc: asyncio.subprocess.Process
    status_fd: int | None
    cgroup: list[Path] | None
    tmpdir: str | None

    def status(self) -> dict[str, Any]:
        """bwrap's --json-status-fd documents (child-pid at start, exit-code at the end)."""
        if self.status_fd is None:
            return {}
        raw = b""
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self.status_fd, 65536):
                raw += chunk
        out: dict[str, Any] = {}
        for line in raw.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                out.update(json.loads(line))
        return out


def _interpreter() -> tuple[str, list[str]]:
    """The real interpreter (not a venv shim) and the directories it needs, resolved once."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    roots = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.base_exec_prefix)}
    if not any(exe.startswith(r + os.sep) for r in roots):
        roots.add(os.path.dirname(exe))
    needed = sorted(r for r in roots if not r.startswith("/usr/"))
    # keep the outermost directories only
    binds = [r for r in needed if not any(r != o and r.startswith(o + os.sep) for o in needed)]
    return exe, binds


def _interpreter_for(uid: int, exe: str, binds: list[str]) -> tuple[str, list[str]] | None:
    """This interpreter if `uid` can reach it, else the system one of the same version."""
    if reachable_by(exe, uid) and all(reachable_by(b, uid) for b in binds):
        return exe, binds
    system = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
    if os.path.exists(system):
        return os.path.realpath(system), []
    return None


class Sandbox:
    """Builds and runs sandboxed commands; `start()` resolves paths and probes that it really works."""

    def __init__(self, mode: Mode = "bwrap", *, bwrap: str = "bwrap", seccomp: bool = True,
                 pids_cgroup: bool = True) -> None:
        self.mode: Mode = mode
        self.bwrap_name = bwrap
        self.want_seccomp = seccomp
        self.want_cgroup = pids_cgroup
        self.python, self.python_binds = _interpreter()
        self.bwrap: str | None = None
        self.seccomp_filter: bytes | None = None
        self.cgroup: Cgroups | None = None
        self.process_limit = "none"
        self.notes: list[str] = []
        self._removals: set[asyncio.Task[None]] = set()
        self.spawn_uid = os.geteuid()
        self.package_binds: list[Bind] = []
        self.proc_mount = True
        self.warm: WarmPool | None = None

    # ---- start-up ---------------------------------------------------------- #
    async def start(self) -> None:
        """Resolve bwrap, build the seccomp filter, set up cgroups and probe; raise SandboxError if unsafe."""
        if self.mode == "unsafe":
            self.notes.append("sandbox=unsafe: programs run as plain subprocesses with rlimits only")
            log.warning("SANDBOX DISABLED (sandbox=unsafe): untrusted code runs WITHOUT bubblewrap isolation")
            return
        self.bwrap = shutil.which(self.bwrap_name)
        if not self.bwrap:
            raise SandboxError(f"bubblewrap not found ({self.bwrap_name!r}); install it (deploy/install.sh "
                               "or apt-get install bubblewrap) or set sandbox=unsafe explicitly")
        if self.want_seccomp:
            self.seccomp_filter = build_filter()
            if self.seccomp_filter is None:
                self.notes.append(f"no seccomp filter for architecture {os.uname().machine}")
        if self.want_cgroup and os.geteuid() == 0:
            self.cgroup = Cgroups.create()
        self.process_limit = "cgroup" if self.cgroup else "rlimit"
        self.spawn_uid = spawn_uid()
        if self.spawn_uid != os.geteuid():
            # bwrap started by root would map the sandbox user onto root outside (and RLIMIT_NPROC
            # never applies to root): the launcher drops to SANDBOX_UID, after any cgroup joins, so
            # the interpreter and every bind must be reachable by that uid
            found = _interpreter_for(self.spawn_uid, self.python, self.python_binds)
            if found is None:
                raise SandboxError(f"no Python interpreter that uid {self.spawn_uid} can run ({self.python} is "
                                   "unreachable and there is no system python of the same version)")
            self.python, self.python_binds = found
            if not reachable_by(self.bwrap, self.spawn_uid):
                raise SandboxError(f"{self.bwrap} cannot be run by uid {self.spawn_uid} (what bwrap runs as when "
                                   "the server is root): make it and its directories readable and searchable")
            self.process_limit += f" (bwrap started as uid {self.spawn_uid})" if not self.cgroup else ""
        self.package_binds = package_binds(uid=self.spawn_uid)
        try:
            await self.probe()
        except SandboxError as exc:
            if "mount proc" not in str(exc):
                raise
            # A container runtime that masks /proc paths (Docker's default) forbids a fresh procfs in
            # an unprivileged user namespace: run without any /proc inside (it shows nothing then).
            self.proc_mount = False
            self.notes.append("no /proc inside the sandbox (the container masks /proc paths); "
                              "nested namespaces refused by the seccomp filter")
            await self.probe()

    async def probe(self) -> None:
        """Run tiny programs that must show: it runs, the env is clean, no network, the fork limit holds,
        the sandbox user is not root outside and no global kernel setting is writable inside."""
        limits = Limits(wall_s=20.0, cpu_s=10.0, processes=8)
        check = (
            "import os, socket, sys\n"
            "assert os.getuid() == %d, os.getuid()\n"
            "assert set(os.environ) <= {'PATH', 'HOME', 'LANG', 'LC_CTYPE', 'PWD'}, sorted(os.environ)\n"
            "assert not os.path.exists(%r), 'server files visible'\n"
            "try:\n"
            "    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); s.settimeout(2)\n"
            "    s.connect(('192.0.2.1', 9))\n"
            "    sys.exit('network reachable')\n"
            "except OSError:\n"
            "    pass\n"
            "kids = []\n"
            "try:\n"
            "    for _ in range(%d):\n"
            "        pid = os.fork()\n"
            "        if pid == 0:\n"
            "            import time; time.sleep(1); os._exit(0)\n"
            "        kids.append(pid)\n"
            "    sys.exit('process limit not enforced')\n"
            "except OSError:\n"
            "    pass\n"
            "print('sandbox-ok')\n"
        ) % (SANDBOX_UID, str(Path(__file__).resolve()), limits.processes + 8)
        result = await self.run(check, b"", limits)
        if result.sandbox_error or "sandbox-ok" not in result.stdout:
            detail = result.sandbox_error or (result.stderr.strip()[-800:] or f"exit code {result.exit_code}")
            raise SandboxError(f"sandbox probe failed: {detail}; fix bubblewrap (unprivileged user namespaces, "
                               "cgroups) or set sandbox=unsafe explicitly")
        # the host-safety half: refuse when the sandbox user is root outside or a global sysctl opens for writing
        result = await self.run(PROBE, b"", limits)
        problems = probe_problems(parse_probe(result.stdout), self.spawn_uid, await self._outside_uids(limits))
        if problems:
            raise SandboxError("unsafe sandbox, refusing to serve: " + "; ".join(problems) +
                               (f" ({result.sandbox_error or result.stderr.strip()[-300:]})"
                                if parse_probe(result.stdout) is None else ""))

    async def _outside_uids(self, limits: Limits) -> dict[int, int]:
        """The host uids of a live sandbox's processes (bwrap, its init, the program)."""
        spawned = await self.spawn(runner.ONE_SHOT, limits)
        proc = spawned.proc
        assert proc.stdin is not None and proc.stdout is not None
        program = b"import time\nprint('up', flush=True)\ntime.sleep(60)\n"
        try:
            proc.stdin.write(len(program).to_bytes(8, "big") + program)
            await proc.stdin.drain()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.stdout.readline(), limits.wall_s)
            return host_uids(proc.pid)
        finally:
            self.kill(spawned)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(proc.wait(), 5.0)
            await self.cleanup(spawned)

    def describe(self) -> dict[str, Any]:
        return {"sandbox": self.mode, "seccomp": self.seccomp_filter is not None,
                "process_limit": self.process_limit if self.mode == "bwrap" else "rlimit",
                "memory_limit": "cgroup+rlimit" if self.cgroup and self.cgroup.memory else "rlimit",
                "python": self.python, **({"sandbox_notes": self.notes} if self.notes else {})}

    async def prestart(self, limits: Limits, size: int, *, parallel: int = 0) -> None:
        """Keep `size` sandboxes started and waiting for a program with these limits (hides start-up latency);
        with `parallel`, sandboxes for `run_batch(..., limits, parallel)` instead of `run`."""
        if size > 0:
            self.warm = WarmPool(self, runner.BATCH if parallel else runner.ONE_SHOT,
                                 limits.batch(parallel) if parallel else limits, size)
            await self.warm.start()

    def _take(self, script: str, limits: Limits) -> Spawned | None:
        if self.warm and self.warm.script == script and self.warm.limits == limits:
            return self.warm.take()
        return None

    async def close(self) -> None:
        if self.warm:
            await self.warm.close()
        if self._removals:
            await asyncio.wait(list(self._removals), timeout=10)
        if self.cgroup:
            await self.cgroup.close()

    # ---- commands ---------------------------------------------------------- #
    def _bwrap_args(self, limits: Limits, status_fd: int, seccomp_fd: int | None, as_pid_1: bool) -> list[str]:
        assert self.bwrap
        binds = [Bind(path, path) for path in self.python_binds] + self.package_binds
        # --disable-userns needs a /proc of the sandbox; without one the seccomp filter (which refuses
        # unshare/setns/clone with CLONE_NEW*) is what keeps nested namespaces out
        return bwrap_argv(self.bwrap, tmp_mb=limits.tmp_mb, binds=binds, proc=self.proc_mount,
                          disable_userns=self.proc_mount or self.seccomp_filter is None,
                          seccomp_fd=seccomp_fd, status_fd=status_fd, as_pid_1=as_pid_1)

    async def spawn(self, script: str, limits: Limits) -> Spawned:
        """Start `python -I -S -c script <limits>` sandboxed, with piped stdio (the program comes on stdin)."""
        # the REPL supervisor stops every other process of its own pid namespace between calls; without
        # bwrap there is no such namespace, so only the worker's process group
        argv_tail = [*limits.runner_args(), "all" if self.mode == "bwrap" else "group"]
        fds: list[int] = []
        status_r: int | None = None
        cgroup: list[Path] | None = None
        tmpdir: str | None = None
        env = {"PATH": INSIDE_PATH, "LANG": "C.UTF-8"}
        try:
            if self.mode == "unsafe":
                tmpdir = tempfile.mkdtemp(prefix="gymserve-code-")
                argv = [self.python, "-I", "-S", "-c", script, *argv_tail]
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, cwd=tmpdir, env={**env, "HOME": tmpdir},
                    start_new_session=True)
                return Spawned(proc, None, None, tmpdir)
            seccomp_fd = None
            if self.seccomp_filter is not None:
                seccomp_fd = os.memfd_create("seccomp", 0)
                fds.append(seccomp_fd)
                os.write(seccomp_fd, self.seccomp_filter)
                os.lseek(seccomp_fd, 0, os.SEEK_SET)
            status_r, status_w = os.pipe()
            fds.append(status_w)
            os.set_blocking(status_r, False)
            argv = unprivileged([*self._bwrap_args(limits, status_w, seccomp_fd, script == runner.BATCH),
                                 self.python, "-I", "-S", "-c",
                                 script, *argv_tail])
            if self.cgroup:
                total_mb = limits.total_memory_mb or 2 * limits.memory_mb
                cgroup = self.cgroup.child(limits.processes + 2, total_mb << 20)
                # joined as root before the launcher drops root and execs bwrap: every descendant is counted
                argv = ["/bin/sh", "-c", 'IFS=:; for p in $0; do echo $$ > "$p/cgroup.procs" || exit 125; done; '
                        'exec "$@"', ":".join(map(str, cgroup)), *argv]
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, pass_fds=fds, start_new_session=True, cwd="/")
            return Spawned(proc, status_r, cgroup, None)
        except BaseException:
            if status_r is not None:
                os.close(status_r)
            if cgroup is not None and self.cgroup:
                await self.cgroup.remove(cgroup)
            if tmpdir:
                shutil.rmtree(tmpdir, ignore_errors=True)
            raise
        finally:
            for fd in fds:
                os.close(fd)

    def kill(self, spawned: Spawned) -> None:
        """Kill the whole sandbox: bwrap (its pid-1 child follows, and with it the pid namespace)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(spawned.proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            spawned.proc.kill()
        if spawned.cgroup is not None:
            Cgroups.kill_all(spawned.cgroup)

    async def cleanup(self, spawned: Spawned) -> None:
        if spawned.status_fd is not None:
            with contextlib.suppress(OSError):
                os.close(spawned.status_fd)
            spawned.status_fd = None
        if spawned.cgroup is not None and self.cgroup:
            # off the reply's critical path: the cgroup can only go once the kernel has reaped every task
            task = asyncio.ensure_future(self.cgroup.remove(spawned.cgroup))
            self._removals.add(task)
            task.add_done_callback(self._removals.discard)
            spawned.cgroup = None
        if spawned.tmpdir:
            shutil.rmtree(spawned.tmpdir, ignore_errors=True)

    # ---- one-shot runs ------------------------------------------------------ #
    async def run(self, program: str, stdin: bytes, limits: Limits, *, warm: bool = True) -> ExecResult:
        """Run `program` once with `stdin`; never raises for anything the program does."""
        spawned = self._take(runner.ONE_SHOT, limits) if warm else None
        result = await self._run(spawned, program, stdin, limits)
        if result.sandbox_error and spawned is not None:
            # a pre-started sandbox that went bad while waiting: try once more with a fresh one
            log.warning("pre-started sandbox failed (%s); retrying cold", result.sandbox_error)
            result = await self._run(None, program, stdin, limits)
        return result

    async def _run(self, spawned: Spawned | None, program: str, stdin: bytes, limits: Limits) -> ExecResult:
        start = time.monotonic()
        if spawned is None:
            try:
                spawned = await self.spawn(runner.ONE_SHOT, limits)
            except OSError as exc:
                return ExecResult("", "", None, sandbox_error=f"could not start the sandbox: {exc}")
        proc = spawned.proc
        code_bytes = program.encode("utf-8", "surrogatepass")
        stdin = len(code_bytes).to_bytes(8, "big") + code_bytes + stdin
        out, err = bytearray(), bytearray()
        state = {"over": False}

        async def feed() -> None:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
                proc.stdin.write(stdin)
                await proc.stdin.drain()
                proc.stdin.close()

        async def pump(stream: asyncio.StreamReader | None, buf: bytearray) -> None:
            assert stream is not None
            while chunk := await stream.read(65536):
                room = limits.output_bytes - len(buf)
                buf += chunk[: max(room, 0)]
                if len(chunk) > room:
                    state["over"] = True
                    self.kill(spawned)
                    return

        timed_out = False
        feeder = asyncio.ensure_future(feed())
        try:
            await asyncio.wait_for(asyncio.gather(pump(proc.stdout, out), pump(proc.stderr, err), proc.wait()),
                                   timeout=limits.wall_s)
        except asyncio.TimeoutError:
            timed_out = True
        finally:
            if proc.returncode is None or timed_out or state["over"]:
                self.kill(spawned)
            feeder.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(proc.wait(), 5.0)
        status = spawned.status()
        oom = bool(spawned.cgroup) and Cgroups.oom_killed(spawned.cgroup or [])
        await self.cleanup(spawned)
        code = proc.returncode
        if code is not None and code < 0:
            code = 128 - code
        stderr = err.decode("utf-8", "replace")
        result = ExecResult(out.decode("utf-8", "replace"), stderr, code, timed_out=timed_out,
                            output_exceeded=state["over"], wall_s=time.monotonic() - start, oom_killed=oom)
        if self.mode == "bwrap" and not timed_out and not state["over"]:
            if "exit-code" in status:
                result.exit_code = int(status["exit-code"])
            else:
                tail = stderr.strip()[-500:] or f"bwrap exited with {code}"
                result.sandbox_error = f"sandbox failed: {tail}"
        if timed_out or state["over"]:
            result.exit_code = None
        return result

    # ---- one sandbox per row ------------------------------------------------ #
    async def run_batch(self, cases: Sequence[tuple[str, bytes]], limits: Limits, parallel: int,
                        slot: Slot) -> list[ExecResult]:
        """Run each (program, stdin) case with `limits` in ONE sandbox (runner.BATCH), up to `parallel`
        at once, each once `slot` admits it; raises SandboxError when the sandbox itself failed."""
        spawned = self._take(runner.BATCH, limits.batch(parallel))
        try:
            return await self._run_batch(spawned, cases, limits, parallel, slot)
        except _FreshSandboxFailed as exc:
            # a pre-started sandbox that went bad while waiting: try once more with a fresh one
            log.warning("pre-started sandbox failed (%s); retrying cold", exc)
            return await self._run_batch(None, cases, limits, parallel, slot)

    async def _run_batch(self, spawned: Spawned | None, cases: Sequence[tuple[str, bytes]], limits: Limits,
                         parallel: int, slot: Slot) -> list[ExecResult]:
        warm = spawned is not None
        if spawned is None:
            try:
                spawned = await self.spawn(runner.BATCH, limits.batch(parallel))
            except OSError as exc:
                raise SandboxError(f"could not start the sandbox: {exc}") from None
        proc = spawned.proc
        stdin_w, stdout_r = proc.stdin, proc.stdout
        assert stdin_w is not None and stdout_r is not None
        lanes = max(1, min(parallel, len(cases)))
        if spawned.cgroup is not None and self.cgroup:
            # the row's share: `lanes` cases' worth (the launcher, bwrap and its init besides)
            total_mb = limits.total_memory_mb or 2 * limits.memory_mb
            self.cgroup.limit(spawned.cgroup, limits.processes * lanes + 3, (total_mb * lanes) << 20)
        results: list[ExecResult | None] = [None] * len(cases)
        held: dict[int, tuple[float, int]] = {}  # case -> (answer deadline, OOM kills when it started)
        refused: list[Exception] = []
        # a test may wait up to a wall clock for its process (a fork bomb of another test of the row
        # holds the process limit until its own wall clock ends), then runs for up to one
        grace = 2 * limits.wall_s + 5.0

        def ooms() -> int:
            return Cgroups.oom_kills(spawned.cgroup) if spawned.cgroup else 0

        async def write() -> None:
            header = json.dumps({"wall_s": limits.wall_s, "output_bytes": limits.output_bytes,
                                 "nproc": limits.processes * lanes + 1}).encode()
            stdin_w.write(len(header).to_bytes(4, "big") + header)
            for i, (program, stdin) in enumerate(cases):
                try:
                    await slot.acquire()
                except Exception as exc:  # refused admission (overload): the caller's to answer
                    refused.append(exc)
                    return
                held[i] = (time.monotonic() + grace, ooms())
                code = program.encode("utf-8", "surrogatepass")
                stdin_w.write(len(code).to_bytes(8, "big") + code + len(stdin).to_bytes(8, "big") + stdin)
                await stdin_w.drain()
            stdin_w.close()

        async def read() -> None:
            most = 12 * limits.output_bytes + 4096  # two streams, JSON escapes at most 6 characters a byte
            for _ in cases:
                size = int.from_bytes(await stdout_r.readexactly(4), "big")
                if size > most:
                    raise SandboxError(f"sandbox reply of {size} bytes")
                msg = json.loads(await stdout_r.readexactly(size))
                i = msg["i"]
                if i not in held or results[i] is not None:
                    raise SandboxError(f"sandbox reply for test {i}, which is not running")
                _, oom_before = held.pop(i)
                slot.release()
                results[i] = ExecResult(str(msg["stdout"]), str(msg["stderr"]), msg["exit_code"],
                                        timed_out=msg["timed_out"] is True, output_exceeded=msg["output_exceeded"] is True,
                                        wall_s=float(msg["wall_s"]), oom_killed=ooms() > oom_before)

        writer, reader = asyncio.ensure_future(write()), asyncio.ensure_future(read())
        problem: str | None = None
        try:
            while not reader.done():
                waiting = {reader} | ({writer} if not writer.done() else set())
                deadline = min((d for d, _ in held.values()), default=None)
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if refused:
                    raise refused[0]
                if reader.done():
                    break
                if writer.done() and writer.exception() is not None:
                    problem = f"could not send the tests to the sandbox ({writer.exception()!r})"
                    break
                if held and min(d for d, _ in held.values()) <= time.monotonic():
                    problem = f"the sandbox did not answer within {grace:.0f} s of starting a test"
                    break
            failure = reader.exception() if problem is None else None
            if failure is not None:
                problem = str(failure) if isinstance(failure, SandboxError) else \
                    f"the sandbox stopped answering ({failure!r})"
        finally:
            for task in (writer, reader):
                task.cancel()
            for _ in held:
                slot.release()
            held.clear()
            answered = reader.done() and not reader.cancelled() and reader.exception() is None
            if problem is None and answered:
                # every answer is in and stdin is closed: the runner exits by itself. Killed now, bwrap
                # would die before reaping it, and the row's CPU (every test's) would go to the host's
                # init instead of this server's children: work nobody could account for.
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(proc.wait(), _EXIT_GRACE_S)
            self.kill(spawned)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(proc.wait(), 5.0)
            stderr = b""
            if problem is not None and proc.stderr is not None:
                with contextlib.suppress(BaseException):
                    stderr = await asyncio.wait_for(proc.stderr.read(4096), 1.0)
            await self.cleanup(spawned)
        if problem is not None:
            tail = stderr.decode("utf-8", "replace").strip()[-500:]
            message = f"sandbox failed: {problem}" + (f": {tail}" if tail else "")
            if warm and not any(results):
                raise _FreshSandboxFailed(message)
            raise SandboxError(message)
        return [r for r in results if r is not None]


class WarmPool:
    """Pre-started sandboxes (one-shot or batch runner) blocked on reading their program from stdin.

    A sandbox is used once (one program, or one row's cases) and replaced in the background, so
    each still gets a fresh one; only bwrap's and the interpreter's start-up move off the request's
    path. The CPU rlimit does not tick while it waits (blocked in read), and the wall clock starts
    when the program is sent."""

    def __init__(self, sandbox: Sandbox, script: str, limits: Limits, size: int) -> None:
        self.sandbox = sandbox
        self.script = script
        self.limits = limits
        self.size = size
        self.ready: collections.deque[Spawned] = collections.deque()
        self.wanted = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.task = asyncio.create_task(self._fill())

    async def _fill(self) -> None:
        while True:
            while len(self.ready) < self.size:
                try:
                    self.ready.append(await self.sandbox.spawn(self.script, self.limits))
                except Exception as exc:  # keep serving cold; retry later
                    log.warning("could not pre-start a sandbox: %s", exc)
                    await asyncio.sleep(1.0)
            self.wanted.clear()
            await self.wanted.wait()

    def take(self) -> Spawned | None:
        self.wanted.set()
        while self.ready:
            spawned = self.ready.popleft()
            if spawned.proc.returncode is None:
                return spawned
            asyncio.ensure_future(self.sandbox.cleanup(spawned))
        return None

    async def close(self) -> None:
        if self.task:
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
        while self.ready:
            spawned = self.ready.popleft()
            self.sandbox.kill(spawned)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(spawned.proc.wait(), 5.0)
            await self.sandbox.cleanup(spawned)
