"""`gymserve up`: run the head and every server of a stack as local child processes.

Each child is `python -m gymserve serve KIND --name N --host H --port P` of this same
interpreter (one install, no per-server virtualenvs). Options travel in the
GYMSERVE_SERVER_SPEC environment variable, never argv, because they may hold secrets
and argv is world-readable in /proc. Every child runs in its own process group
(so stopping it also stops its worker pool and sandboxes) and asks the kernel to
SIGTERM it when the launcher dies (PR_SET_PDEATHSIG), so nothing is orphaned even
if the launcher itself is SIGKILLed. A child's environment holds only a base set and
the variables its spec references (`gymserve.child_env`).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import importlib.util
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TextIO

import httpx

from services.core.app import server_type_name
from services.core.hosts import connect_url
from services.core.auth import auth_headers
from services.core.config import ConfigError, Stack, interpolate
from services.core.loader import available_kinds, is_package_kind, load_server, module_name
from services.core.ports import free_port, port_free

from .child_env import child_env

LOG_TAIL_LINES = 40
_PR_SET_PDEATHSIG = 1


def _child_preexec(parent_pid: int) -> Callable[[], None]:
    """Runs in the child between fork and exec: die with the launcher."""

    def preexec() -> None:
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except Exception:
            pass
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os._exit(1)

    return preexec


@dataclass(eq=False)
class Child:
    name: str
    kind: str
    host: str
    port: int
    spec: dict[str, Any]
    env: dict[str, str]
    proc: asyncio.subprocess.Process | None = None
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES))
    started_at: float = 0.0
    restarts: int = 0
    ready: bool = False
    pump: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return connect_url(self.host, self.port)

    @property
    def server_type(self) -> str:
        return "head_server" if self.kind == "head" else server_type_name(self.kind)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def last_lines(self, n: int = 20) -> str:
        lines = list(self.tail)[-n:]
        return "\n".join(f"    {line}" for line in lines) if lines else "    (no output)"


def check_kind(name: str, kind: str, where: str) -> None:
    """A kind with no implementation is a config error naming the instance, before anything starts."""
    from gymserve.nemo_gym import is_nemo_kind

    if is_nemo_kind(kind):  # NeMo-Gym's servers: the name is checked against its wheel by `prepare`
        from gymserve.nemo_gym.sidecar import nemo_server_name

        try:
            nemo_server_name(kind)
        except ConfigError as exc:
            raise ConfigError(f"{where}: servers.{name}: {exc}") from None
        return
    if is_package_kind(kind):  # from an installed package: it must load here (the children share this interpreter)
        try:
            load_server(kind)
        except ConfigError as exc:
            raise ConfigError(f"{where}: servers.{name}: {exc}") from None
        return
    try:
        module = module_name(kind)
    except ConfigError as exc:
        raise ConfigError(f"{where}: servers.{name}: {exc}") from None
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise ConfigError(f"{where}: servers.{name}: server kind {kind!r} does not exist (no module {module}); "
                          f"available kinds: head, {', '.join(available_kinds())}")


def plan(stack: Stack, *, where: str = "stack") -> list[Child]:
    """Validate the stack and decide every child's port, command environment and options."""
    for name, spec in stack.servers.items():
        if name == "head":
            raise ConfigError(f"{where}: servers.head: the name 'head' is reserved for the head server")
        check_kind(name, spec.kind, where)
        interpolate(spec.options, where=f"{where}: servers.{name}")  # a missing ${VAR} fails now, named
    taken: set[int] = set()

    def port_for(label: str, host: str, port: int) -> int:
        if port:
            if port in taken or not port_free(host, port):
                raise ConfigError(f"{where}: {label}.port: port {port} on {host} is already in use "
                                  f"(choose another, e.g. {label}.port=0 for a free one)")
        else:
            port = free_port(host)
            while port in taken:
                port = free_port(host)
        taken.add(port)
        return port

    stack.head.port = port_for("head", stack.head.host, stack.head.port)
    for name, spec in stack.servers.items():
        spec.port = port_for(f"servers.{name}", spec.host, spec.port)

    def env_for(spec: Any) -> dict[str, str]:
        env = {k: v for k, v in child_env(spec).items() if k not in ("GYMSERVE_SERVER_SPEC", "GYMSERVE_HEAD_URL")}
        return {**env, "PYTHONUNBUFFERED": "1"}

    head_url = connect_url(stack.head.host, stack.head.port)
    head_spec = {"stack": stack.model_dump(mode="json")}
    children = [Child("head", "head", stack.head.host, stack.head.port, head_spec,
                      {**env_for(head_spec), "GYMSERVE_SERVER_SPEC": json.dumps(head_spec)})]
    for name, spec in stack.servers.items():
        children.append(Child(name, spec.kind, spec.host, spec.port, spec.options, {
            **env_for(spec.options), "GYMSERVE_SERVER_SPEC": json.dumps(spec.options), "GYMSERVE_HEAD_URL": head_url}))
    return children


class Launcher:
    """Starts, watches, restarts and stops the children of one stack."""

    def __init__(self, children: list[Child], *, ready_timeout_s: float = 300.0, restart: bool = True,
                 backoff_s: float = 1.0, backoff_max_s: float = 30.0, stable_after_s: float = 60.0,
                 grace_s: float = 10.0, out: TextIO | None = None, color: bool | None = None) -> None:
        self.children = children
        self.ready_timeout_s = ready_timeout_s
        self.restart = restart
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.stable_after_s = stable_after_s
        self.grace_s = grace_s
        self.out = out or sys.stdout
        self.color = self.out.isatty() if color is None else color
        self._stop: asyncio.Event | None = None
        self._stopping = False
        self._signal: int | None = None
        self._width = min(24, max(len(c.name) for c in children))  # longer names just push the line

    # ---- output ------------------------------------------------------------ #
    def _write(self, text: str) -> None:
        # a closed or broken stdout (`gymserve up | head`) must not stop us draining the
        # children's pipes, or they would block on their next log line
        try:
            self.out.write(text)
            self.out.flush()
        except (OSError, ValueError):
            pass

    def say(self, message: str) -> None:
        prefix = "\x1b[1m[gymserve]\x1b[0m" if self.color else "[gymserve]"
        self._write(f"{prefix} {message}\n")

    def _echo(self, child: Child, line: str) -> None:
        tag = f"[{child.name}]".ljust(self._width + 2)
        if self.color:
            tag = f"\x1b[{31 + sum(map(ord, child.name)) % 6}m{tag}\x1b[0m"
        self._write(f"{tag} {line}\n")

    # ---- children ---------------------------------------------------------- #
    async def _spawn(self, child: Child) -> None:
        cmd = [sys.executable, "-m", "gymserve", "serve", child.kind, "--name", child.name,
               "--host", child.host, "--port", str(child.port)]
        child.proc = await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env=child.env, start_new_session=True, preexec_fn=_child_preexec(os.getpid()),
        )
        child.started_at = time.monotonic()
        child.ready = False
        child.pump = asyncio.create_task(self._pump(child, child.proc))

    async def _pump(self, child: Child, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            try:
                raw = await proc.stdout.readline()
            except (ValueError, asyncio.LimitOverrunError):  # an enormous line: skip it
                continue
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip("\n")
            child.tail.append(line)
            self._echo(child, line)

    async def _probe(self, client: httpx.AsyncClient, child: Child) -> bool:
        try:
            return (await client.get(f"{child.url}/ready", timeout=2.0)).status_code == 200
        except httpx.HTTPError:
            return False

    def _signal_group(self, child: Child, sig: int) -> None:
        if child.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.proc.pid, sig)

    # ---- phases ------------------------------------------------------------ #
    async def _wait_all_ready(self) -> str | None:
        """None once every child is ready; otherwise the error message (child died / timed out / stop)."""
        deadline = time.monotonic() + self.ready_timeout_s
        assert self._stop is not None
        async with httpx.AsyncClient(trust_env=False, headers=auth_headers()) as client:
            while True:
                pending = [c for c in self.children if not c.ready]
                if not pending:
                    return None
                for child in pending:
                    assert child.proc is not None
                    if child.proc.returncode is not None:
                        await self._drain(child)
                        return (f"server {child.name!r} ({child.kind}) exited with code {child.proc.returncode} "
                                f"during start-up; its last log lines:\n{child.last_lines()}")
                results = await asyncio.gather(*(self._probe(client, c) for c in pending))
                for child, ok in zip(pending, results):
                    child.ready = ok
                if all(results):
                    return None
                if time.monotonic() > deadline:
                    late = [c for c, ok in zip(pending, results) if not ok]
                    return "\n".join(
                        f"server {c.name!r} ({c.kind}) was not ready after {self.ready_timeout_s:g}s "
                        f"(GET {c.url}/ready); its last log lines:\n{c.last_lines()}" for c in late)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 0.2)
                if self._stop.is_set():
                    return "stopped before every server was ready"

    async def _drain(self, child: Child) -> None:
        if child.pump:
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(child.pump), 2.0)

    async def _supervise(self, child: Child) -> None:
        """Restart `child` whenever it exits, with exponential backoff, until the launcher stops."""
        assert self._stop is not None
        delay = self.backoff_s
        while not self._stopping:
            assert child.proc is not None
            code = await child.proc.wait()
            if self._stopping:
                return
            await self._drain(child)
            ran = time.monotonic() - child.started_at
            if ran > self.stable_after_s:
                delay = self.backoff_s
            if not self.restart:
                self.say(f"server {child.name!r} exited with code {code}; not restarting (--no-restart)")
                return
            child.restarts += 1
            self.say(f"server {child.name!r} exited with code {code} after {ran:.1f}s; "
                     f"restarting in {delay:g}s (restart #{child.restarts})")
            self._signal_group(child, signal.SIGKILL)  # leftovers of the dead one (pool workers)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)
            if self._stopping:
                return
            delay = min(self.backoff_max_s, delay * 2)
            try:
                await self._spawn(child)
            except OSError as exc:
                self.say(f"could not restart {child.name!r}: {exc}")
                continue
            asyncio.create_task(self._announce_ready(child))

    async def _announce_ready(self, child: Child) -> None:
        proc = child.proc
        async with httpx.AsyncClient(trust_env=False, headers=auth_headers()) as client:
            while not self._stopping and child.proc is proc and proc is not None and proc.returncode is None:
                if await self._probe(client, child):
                    child.ready = True
                    self.say(f"server {child.name!r} is ready again (pid {proc.pid}, {child.url})")
                    return
                await asyncio.sleep(0.2)

    async def stop_all(self) -> None:
        self._stopping = True
        servers = [c for c in self.children if c.kind != "head"]
        heads = [c for c in self.children if c.kind == "head"]
        for group in (servers, heads):  # servers first, so none heartbeats into a stopped head
            running = [c for c in group if c.proc and c.proc.returncode is None]
            for child in running:
                self._signal_group(child, signal.SIGTERM)
            waits = [asyncio.ensure_future(c.proc.wait()) for c in running if c.proc]
            if waits:
                _, late = await asyncio.wait(waits, timeout=self.grace_s)
                for task in late:
                    task.cancel()
            for child in group:
                if child.proc and child.proc.returncode is None:
                    self.say(f"server {child.name!r} did not stop within {self.grace_s:g}s; killing it")
                # the whole group, always: grandchildren (pool workers, sandboxes) must not outlive us
                self._signal_group(child, signal.SIGKILL)
            for child in group:
                if child.proc and child.proc.returncode is None:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(child.proc.wait(), 5.0)
                await self._drain(child)

    def _start_failed(self, error: str) -> int:
        """Exit code of a start-up that did not complete: 0 when a signal stopped it, else 1."""
        if self._stop is not None and self._stop.is_set():
            self.say(error)
            return 0
        self.say(f"start-up failed: {error}")
        return 1

    def _on_signal(self, sig: int) -> None:
        assert self._stop is not None
        if self._stop.is_set():
            self.say("second signal: killing every server now")
            self.grace_s = 0.0
            for child in self.children:
                self._signal_group(child, signal.SIGKILL)
        self._signal = sig
        self._stop.set()

    def print_table(self) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=None, show_lines=False)
        for column in ("name", "type", "kind", "url", "pid"):
            table.add_column(column)
        for child in self.children:
            table.add_row(child.name, child.server_type, child.kind, child.url, str(child.pid or ""))
        try:
            console = Console(file=self.out, width=None if self.out.isatty() else 240,
                              force_terminal=self.color, no_color=not self.color)
            console.print(table)
            self.out.flush()
        except (OSError, ValueError):
            pass

    async def run(self) -> int:
        """Run until SIGINT/SIGTERM; 0 on a clean stop, 1 if the stack could not start."""
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        supervisors: list[asyncio.Task[None]] = []
        try:
            head = self.children[0]
            self.say(f"starting {len(self.children)} servers; head on {head.url}")
            for child in self.children:
                await self._spawn(child)
            error = await self._wait_all_ready()
            if error is not None:
                return self._start_failed(error)
            self.say(f"all {len(self.children)} servers ready")
            self.print_table()
            self.say(f"head: {head.url}  dashboard: {head.url}/dashboard  (Ctrl-C stops every server)")
            supervisors = [asyncio.create_task(self._supervise(c)) for c in self.children]
            await self._stop.wait()
            self.say(f"received {signal.Signals(self._signal).name if self._signal else 'stop'}; "
                     f"stopping {len(self.children)} servers")
            return 0
        finally:
            await self.stop_all()
            for task in supervisors:
                task.cancel()
            await asyncio.gather(*supervisors, return_exceptions=True)
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            self.say("all servers stopped")
