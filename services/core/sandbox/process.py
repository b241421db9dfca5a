"""A subprocess with stdin, a wall-clock kill of its whole process group, and capped output."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

from .workspace import ExecResult


async def pump(stream: asyncio.StreamReader | None, buf: bytearray, limit: int, over: asyncio.Event) -> None:
    """Read a pipe to its end, keeping at most `limit` bytes; sets `over` when more came."""
    assert stream is not None
    while chunk := await stream.read(65536):
        room = limit - len(buf)
        buf += chunk[: max(room, 0)]
        if len(chunk) > room:
            over.set()
            return


async def run_process(argv: list[str], stdin: bytes, wall_s: float, output_bytes: int, *,
                      env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = (),
                      stderr_mark: int = 0) -> ExecResult:
    """Run `argv` in its own process group with a wall-clock kill and capped output. `stderr_mark` bytes
    more are kept on stderr for the start mark a provider's wrapper writes there (stripped later)."""
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
                                                cwd="/", pass_fds=pass_fds)
    out, err, over = bytearray(), bytearray(), asyncio.Event()

    async def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError, OSError):
            proc.stdin.write(stdin)
            await proc.stdin.drain()
            proc.stdin.close()

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    feeder = asyncio.ensure_future(feed())
    watcher: asyncio.Future[Any] = asyncio.ensure_future(over.wait())
    work: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(pump(proc.stdout, out, output_bytes, over),
                                                pump(proc.stderr, err, output_bytes + stderr_mark, over), proc.wait()))
    timed_out = False
    try:
        done, _ = await asyncio.wait({work, watcher}, timeout=wall_s, return_when=asyncio.FIRST_COMPLETED)
        timed_out = not done
    finally:
        if not work.done():
            kill()
        for task in (feeder, watcher, work):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(proc.wait(), 10.0)
    code = proc.returncode
    killed = timed_out or over.is_set()
    return ExecResult(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                      None if killed else (128 - code if code is not None and code < 0 else code),
                      timed_out=timed_out, output_exceeded=over.is_set())
