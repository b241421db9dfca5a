"""A persistent sandboxed Python interpreter per tool session (server side of the frame protocol)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from typing import Any

from . import runner
from .sandbox import Limits, Sandbox, SandboxError, Spawned


class ReplClosed(Exception):
    """A call on the interpreter of a session that was closed meanwhile."""


class Repl:
    """One long-lived `runner.REPL` sandbox (a supervisor and the worker that runs the user's code) per
    session. Not concurrency-safe: the session lock serialises calls. A call that overruns its wall
    clock kills the sandbox (its state is lost and the reply says so); a sandbox that dies or breaks
    the protocol raises SandboxError (a masked `sandbox` failure); either way the next call starts a
    fresh one."""

    def __init__(self, sandbox: Sandbox, limits: Limits) -> None:
        self.sandbox = sandbox
        self.limits = limits
        self.spawned: Spawned | None = None
        self._stderr = bytearray()
        self._drain: asyncio.Task[None] | None = None
        self.restarts = 0
        self.closed = False  # by `close(final=True)`: its session is gone, nothing may start again

    async def _start(self) -> Spawned:
        try:
            spawned = await self.sandbox.spawn(runner.REPL, self.limits)
        except OSError as exc:
            raise SandboxError(f"could not start the sandbox: {exc}") from None
        self._stderr = bytearray()
        self._drain = asyncio.ensure_future(self._drain_stderr(spawned))
        return spawned

    async def _drain_stderr(self, spawned: Spawned) -> None:
        stream = spawned.proc.stderr
        assert stream is not None
        while chunk := await stream.read(4096):
            if len(self._stderr) < 8192:
                self._stderr += chunk

    async def execute(self, code: str, wall_s: float) -> dict[str, Any]:
        fresh = self.spawned is None
        if self.closed:
            raise ReplClosed("the session was closed")
        if self.spawned is None:
            self.spawned = await self._start()
            if self.closed:  # closed while it started: end it here, or it outlives its session
                await self.close(final=True)
                raise ReplClosed("the session was closed")
        proc = self.spawned.proc
        assert proc.stdin is not None and proc.stdout is not None
        payload = json.dumps({"code": code, "max_output": self.limits.output_bytes}).encode()
        try:
            proc.stdin.write(struct.pack(">I", len(payload)) + payload)
            await asyncio.wait_for(self._reply(proc.stdin, proc.stdout), timeout=wall_s)
            reply = self._last
        except asyncio.TimeoutError:
            await self.close()
            return {"stdout": "", "stderr": f"execution timed out after {wall_s:g}s; the interpreter was "
                                            "killed and its state is lost", "exit_code": None, "timed_out": True,
                    "evaluated": False, "result": None, "truncated": False, "state_lost": True}
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, OSError, RuntimeError) as exc:
            # RuntimeError: a write to the pipe of a sandbox that died between calls (uvloop)
            # the supervisor inside the sandbox (not the user's code: that runs in its child) is gone or
            # answered garbage: an infrastructure failure; the next call starts a fresh interpreter
            if self.closed:
                raise ReplClosed("the session was closed") from None
            code_, _ = await self._exit_status()
            detail = bytes(self._stderr).decode(errors="replace").strip()[-500:]
            await self.close()
            raise SandboxError(f"the sandboxed interpreter was lost (exit code {code_}, {type(exc).__name__})"
                               + (f": {detail}" if detail else "")) from None
        if fresh and self.restarts:
            reply["state_lost"] = True
        return reply

    async def _reply(self, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader) -> None:
        await stdin.drain()
        (size,) = struct.unpack(">I", await stdout.readexactly(4))
        if size > 20 * self.limits.output_bytes + 65536:  # stdout, stderr, result: each <= 6 x once JSON-escaped
            raise ValueError("oversized frame")
        self._last = json.loads(await stdout.readexactly(size))
        if not isinstance(self._last, dict):
            raise ValueError("bad frame")
        self._last = {"stdout": str(self._last.get("stdout", "")), "stderr": str(self._last.get("stderr", "")),
                      "exit_code": self._last.get("exit_code") if isinstance(self._last.get("exit_code"), int) else 1,
                      "timed_out": False, "evaluated": bool(self._last.get("evaluated")),
                      "result": self._last.get("result") if isinstance(self._last.get("result"), str) else None,
                      "truncated": bool(self._last.get("truncated")),
                      **({"state_lost": True} if self._last.get("state_lost") is True else {})}

    async def _exit_status(self) -> tuple[int | None, dict[str, Any]]:
        """The dead interpreter's exit code and bwrap's status documents."""
        if self.spawned is None:
            return None, {}
        with contextlib.suppress(asyncio.TimeoutError):
            code = await asyncio.wait_for(self.spawned.proc.wait(), 2.0)
            if self._drain:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(self._drain), 1.0)
            status = self.spawned.status()
            code = int(status.get("exit-code", code))
            return (128 - code if code < 0 else code), status
        return None, {}

    async def close(self, *, final: bool = False) -> None:
        self.closed = self.closed or final
        spawned, self.spawned = self.spawned, None
        if spawned is None:
            return
        self.restarts += 1
        self.sandbox.kill(spawned)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(spawned.proc.wait(), 5.0)
        if self._drain:
            self._drain.cancel()
        await self.sandbox.cleanup(spawned)
