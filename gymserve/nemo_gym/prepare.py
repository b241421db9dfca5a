"""Before a stack starts: the virtualenvs of its NeMo-Gym servers, built once with a progress line.

Built here, in `gymserve up`, rather than in each server's start-up, so a first build (minutes) is
not counted against the servers' ready timeout and is said once, up front; later starts find the
stamps and go straight on.
"""
from __future__ import annotations

import subprocess

from services.core.config import ConfigError, Stack

from . import is_nemo_kind
from .sidecar import nemo_server_name
from .venv import Say, base_venv, is_built, server_venv
from .wheel import package_root, server_files


def _say(message: str) -> None:
    print(f"[gymserve] {message}", flush=True)


def prepare_stack(stack: Stack, *, say: Say = _say, where: str = "stack") -> None:
    names = {name: nemo_server_name(spec.kind) for name, spec in stack.servers.items() if is_nemo_kind(spec.kind)}
    if not names:
        return
    if not is_built():
        say("NeMo-Gym servers in the stack: building NeMo-Gym 0.7.0's virtualenv (first use only)")
    root = package_root(base_venv(say=say))
    for name, server in names.items():
        try:
            files = server_files(root, server)
        except ConfigError as exc:
            raise ConfigError(f"{where}: servers.{name}: {exc}") from None
        try:
            server_venv(server, files.requirements, say=say)
        except subprocess.CalledProcessError as exc:
            raise ConfigError(f"{where}: servers.{name}: the requirements of NeMo-Gym's {server} do not install "
                              f"here: {(exc.stderr or '').strip()[-1500:]}") from None
