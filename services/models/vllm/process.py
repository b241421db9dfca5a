"""The vLLM OpenAI server as a child process of the models/vllm server.

The child listens on a loopback port of its own with a random key (only the front server talks
to it). It stays in the server's process group, so `gymserve up`, which always kills a server's
whole group, takes vLLM's engine and worker processes with it; it also gets SIGTERM from the
kernel when its parent dies (PR_SET_PDEATHSIG), and `stop()` ends its whole process tree.
Its output goes to the parent's stdout with a `[vllm]` prefix, so `gymserve up` shows it.
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx

log = logging.getLogger("gymserve.models.vllm")
_PR_SET_PDEATHSIG = 1


def _preexec(parent: int) -> Callable[[], None]:
    def preexec() -> None:
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


@dataclass
class VLLMProcess:
    """One vLLM server: `command` is the full argv, `env` its environment, `port` where it listens."""

    command: list[str]
    env: dict[str, str]
    port: int
    key: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    proc: asyncio.subprocess.Process | None = None
    pump: asyncio.Task[None] | None = None
    tail: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self, timeout_s: float) -> None:
        """Start vLLM and wait until `/health` answers (or raise with its last log lines)."""
        env = {**self.env, "VLLM_API_KEY": self.key}
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=env, preexec_fn=_preexec(os.getpid()))
        self.pump = asyncio.create_task(self._pump())
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(trust_env=False) as client:
            while True:
                if self.proc.returncode is not None:
                    await asyncio.sleep(0.5)  # the last lines
                    raise RuntimeError(f"vLLM exited with code {self.proc.returncode} during start-up:\n"
                                       + "\n".join(self.tail[-40:]))
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/health", timeout=2.0)).status_code == 200:
                        return
                if time.monotonic() > deadline:
                    await self.stop()
                    raise RuntimeError(f"vLLM was not up after {timeout_s:g}s:\n" + "\n".join(self.tail[-40:]))
                await asyncio.sleep(0.5)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            try:
                raw = await self.proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                continue
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip("\n")
            self.tail = (self.tail + [line])[-200:]
            sys.stdout.write(f"[vllm] {line}\n")
            sys.stdout.flush()

    async def stop(self, grace_s: float = 15.0) -> None:
        proc = self.proc
        if proc is None:
            return
        tree = descendants(proc.pid)  # the engine core and workers, before their parent goes
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), grace_s)
        for pid in [proc.pid, *tree, *descendants(proc.pid)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 5.0)
        if self.pump is not None:
            self.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.pump


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc), children first."""
    out: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        try:
            children = [int(c) for c in open(f"/proc/{current}/task/{current}/children").read().split()]
        except (OSError, ValueError):
            continue
        out.extend(children)
        todo.extend(children)
    return out
