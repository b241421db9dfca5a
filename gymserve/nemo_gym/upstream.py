"""One NeMo-Gym resources server process: started from its own virtualenv the way NeMo-Gym's
launcher starts it, bound to 127.0.0.1 only, watched and restarted when it dies.

NeMo-Gym starts a server as `<venv>/bin/python app.py` in the server's folder, with the merged config
as YAML in NEMO_GYM_CONFIG_DICT and the server's instance name in NEMO_GYM_CONFIG_PATH; so do we. Its
servers have no authentication, so it never binds beyond loopback, and its environment carries none
of our secrets (no GYMSERVE_* variable reaches it).
"""
from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from services.core.ports import free_port

from .wheel import RESOURCES, ServerFiles

log = logging.getLogger("gymserve.nemo_gym")
# what NeMo-Gym's server process may see of ours: nothing but the basics
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
              "PIP_INDEX_URL", "HF_HOME", "HF_HUB_OFFLINE")
LOOPBACK = "127.0.0.1"


def nemo_config(files: ServerFiles, name: str, port: int, options: dict[str, Any],
                head: tuple[str, int] | None = None) -> dict[str, Any]:
    """The merged config NeMo-Gym would hand this server: its own block from its config file, the stack
    entry's options on top, our loopback port, and the head server's address."""
    block = {**files.block, **options, "host": LOOPBACK, "port": port}
    config: dict[str, Any] = {name: {RESOURCES: {files.impl: block}}, "dry_run": False}
    config["head_server"] = {"host": head[0], "port": head[1]} if head else {"host": LOOPBACK, "port": free_port()}
    return config


def _pdeathsig() -> None:
    """Runs in the child between fork and exec: die with the sidecar (and its process group with it)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class Upstream:
    """The NeMo-Gym server process of one sidecar."""

    def __init__(self, files: ServerFiles, venv: Path, name: str, options: dict[str, Any], *,
                 head: tuple[str, int] | None, start_timeout_s: float, backoff_s: float = 1.0,
                 backoff_max_s: float = 30.0) -> None:
        self.files = files
        self.venv = venv
        self.name = name
        self.options = options
        self.head = head
        self.start_timeout_s = start_timeout_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.port = 0
        self.proc: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.restarts = 0
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None
        self._pump: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.returncode is None else None

    async def start(self) -> None:
        """Start the server and wait for its `/health` (raises if it exits or stays silent)."""
        await self._spawn()
        await self._wait_healthy()
        self._watch = asyncio.create_task(self._supervise())

    async def _spawn(self) -> None:
        self.ready.clear()
        self.port = free_port(LOOPBACK)
        config = nemo_config(self.files, self.name, self.port, self.options, self.head)
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(PYTHONUNBUFFERED="1", NEMO_GYM_CONFIG_DICT=yaml.safe_dump(config), NEMO_GYM_CONFIG_PATH=self.name,
                   RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled")
        self.proc = await asyncio.create_subprocess_exec(
            str(self.venv / "bin" / "python"), str(self.files.app), cwd=str(self.files.folder), env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True, preexec_fn=_pdeathsig)
        self.started_at = time.monotonic()
        self._pump = asyncio.create_task(self._echo(self.proc))

    async def _echo(self, proc: asyncio.subprocess.Process) -> None:
        """Its log lines go to ours (the launcher shows them under the server's name)."""
        assert proc.stdout is not None
        self.tail: list[str] = []
        while True:
            try:
                raw = await proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):
                continue
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip("\n")
            self.tail = [*self.tail[-39:], line]
            sys.stdout.write(f"[nemo-gym] {line}\n")
            sys.stdout.flush()

    async def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        proc = self.proc
        assert proc is not None
        async with httpx.AsyncClient(trust_env=False) as client:
            while time.monotonic() < deadline:
                if proc.returncode is not None:
                    if self._pump:
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(asyncio.shield(self._pump), 2)
                    raise RuntimeError(f"NeMo-Gym's {self.files.name} server exited with code {proc.returncode} "
                                       "while starting; its last lines:\n" + "\n".join(getattr(self, "tail", [])))
                try:
                    if (await client.get(f"{self.url}/health", timeout=2)).status_code == 200:
                        self.ready.set()
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
        raise RuntimeError(f"NeMo-Gym's {self.files.name} server did not answer /health within "
                           f"{self.start_timeout_s:g}s")

    async def _supervise(self) -> None:
        """Restart the server whenever it exits, with exponential backoff, until we stop."""
        delay = self.backoff_s
        while not self._stopping:
            assert self.proc is not None
            code = await self.proc.wait()
            self.ready.clear()
            if self._stopping:
                return
            if time.monotonic() - self.started_at > 60:
                delay = self.backoff_s
            self.restarts += 1
            log.warning("NeMo-Gym's %s server exited with code %s; restarting in %gs (restart #%d)",
                        self.files.name, code, delay, self.restarts)
            print(f"[gymserve] NeMo-Gym's {self.files.name} server exited with code {code}; restarting "
                  f"(restart #{self.restarts})", flush=True)
            self._kill_group()
            await asyncio.sleep(delay)
            delay = min(self.backoff_max_s, delay * 2)
            try:
                await self._spawn()
                await self._wait_healthy()
            except (OSError, RuntimeError) as exc:
                log.warning("restarting NeMo-Gym's %s server failed: %s", self.files.name, exc)

    def _kill_group(self) -> None:
        """The server's whole process group: whatever it started (workers) goes with it."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    async def stop(self) -> None:
        self._stopping = True
        if self._watch:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
        proc = self.proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 10)
        self._kill_group()
        if proc is not None and proc.returncode is None:
            await proc.wait()
        if self._pump:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._pump, 2)

    async def wait_ready(self, timeout_s: float) -> bool:
        """Whether the server is (again) up within `timeout_s`."""
        try:
            await asyncio.wait_for(self.ready.wait(), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
