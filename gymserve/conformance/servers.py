"""The servers a check runs: the one under test and the helpers it needs, as real local processes."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from typing import Any

from gymserve.testing import ServerProcess

START_TIMEOUT_S = 240.0  # a loaded CI machine; a model server converts its weights on first start


class Servers:
    """Starts servers side by side with one fresh API key, and stops them all (logs removed) on exit."""

    def __init__(self) -> None:
        self.key = secrets.token_hex(12)
        self.env = {"GYMSERVE_API_KEY": self.key, "GYMSERVE_API_KEY_FILE": "", "GYMSERVE_HEAD_URL": "",
                    "GYMSERVE_SERVER_SPEC": "", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        self._running: list[ServerProcess] = []

    def process(self, kind: str, *overrides: str, spec: dict[str, Any] | None = None) -> ServerProcess:
        """A server not started yet; its URL is known already, so helpers can be pointed at each other.
        `spec` holds options that do not fit on a command line (multi-line text)."""
        env = {**self.env, "GYMSERVE_SERVER_SPEC": json.dumps(spec) if spec else ""}
        return ServerProcess(kind, *overrides, name=_instance_name(kind), env=env,
                             ready_timeout_s=START_TIMEOUT_S, keep_log=False)

    def start(self, *procs: ServerProcess) -> None:
        """Launch every server at once, then wait until each is ready."""
        for proc in procs:
            self._running.append(proc.launch())
        for proc in procs:
            proc.wait_ready()

    def close(self) -> None:
        while self._running:
            self._running.pop().stop()


def _instance_name(kind: str) -> str:
    return "check_" + kind.rsplit("/", 1)[-1]


@contextlib.contextmanager
def servers() -> Iterator[Servers]:
    pool = Servers()
    try:
        yield pool
    finally:
        pool.close()
