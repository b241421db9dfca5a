"""A small real stack for trainer tests: head + servers that self-register with it."""
from __future__ import annotations

import contextlib
import time
from typing import Iterator

import httpx

from gymserve.testing import ServerProcess
from services.core.auth import auth_headers


@contextlib.contextmanager
def small_stack(servers: list[tuple[str, str, list[str]]], *, ready_timeout_s: float = 180.0,
                head_env: dict[str, str] | None = None) -> Iterator[tuple[ServerProcess, dict[str, ServerProcess]]]:
    """Start the head (with `head_env`), then each `(kind, name, overrides)` with GYMSERVE_HEAD_URL set;
    wait until the head lists all of them. Yields (head, {name: process}); stops everything on exit."""
    head = ServerProcess("head", name="head", env=head_env).start()
    started: dict[str, ServerProcess] = {}
    try:
        env = {"GYMSERVE_HEAD_URL": head.url}
        for kind, name, overrides in servers:
            started[name] = ServerProcess(kind, *overrides, name=name, env=env,
                                          ready_timeout_s=ready_timeout_s).start()
        wait_registered(head.url, [name for _, name, _ in servers])
        yield head, started
    finally:
        for proc in reversed(list(started.values())):
            proc.stop()
        head.stop()


def wait_registered(head_url: str, names: list[str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    missing = set(names)
    while time.monotonic() < deadline:
        rows = httpx.get(f"{head_url}/server_instances", timeout=5, headers=auth_headers()).json()
        missing = set(names) - {r["name"] for r in rows}
        if not missing:
            return
        time.sleep(0.1)
    raise TimeoutError(f"not registered with the head: {sorted(missing)}")
