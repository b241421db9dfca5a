"""A gymserve server started by NeMo-Gym's own launcher (`gym env start`, `gym eval run`, `gym eval reverify`).

NeMo-Gym starts each configured server as `<venv>/bin/python <entrypoint>` in the server's folder and
hands it the whole merged config (NEMO_GYM_CONFIG_DICT, YAML) and the server's top-level name
(NEMO_GYM_CONFIG_PATH). `deploy/nemo_gym/resources_servers/gymserve/app.py` calls `main()` here, which
serves the gymserve kind its block names (`kind: resources/math`) on the host and port NeMo-Gym
assigned, with the block's other keys as the server's options. NeMo-Gym's clients send no key, so
the server runs without one, which is only allowed on a loopback address.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Any

import yaml

from services.core.config import ConfigError
from services.core.hosts import is_loopback

CONFIG_ENV, NAME_ENV = "NEMO_GYM_CONFIG_DICT", "NEMO_GYM_CONFIG_PATH"
# keys of a NeMo-Gym server block that describe it to NeMo-Gym, not options of the gymserve server
NEMO_KEYS = {"entrypoint", "host", "port", "url", "kind", "domain", "verified", "description", "value", "datasets",
             "name", "license"}


def server_block(config: dict[str, Any], name: str) -> tuple[str, dict[str, Any]]:
    """(gymserve kind, options) of the server NeMo-Gym named `name` in its merged config."""
    entry = config.get(name)
    if not isinstance(entry, dict) or len(entry) != 1:
        raise ConfigError(f"{NAME_ENV}={name!r}: no single server block of that name in {CONFIG_ENV}")
    [(server_type, implementations)] = entry.items()
    if not isinstance(implementations, dict) or len(implementations) != 1:
        raise ConfigError(f"{name}.{server_type}: expected exactly one implementation")
    [(_, block)] = implementations.items()
    kind = block.get("kind") if isinstance(block, dict) else None
    if not isinstance(kind, str) or "/" not in kind:
        raise ConfigError(f"{name}: set `kind` to the gymserve server to run (e.g. kind: resources/math)")
    return kind, block


def follow_the_parent() -> None:
    """NeMo-Gym stops a server by killing the shell it started it with (SIGINT, then SIGKILL after 1 s),
    which leaves the server itself running: ask Linux for a SIGTERM when that shell dies (uvicorn's
    graceful stop), and leave at once if it is already gone."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        raise SystemExit(0)


def main() -> int:
    from gymserve.commands.serve import load_config, serve

    follow_the_parent()
    config = yaml.safe_load(os.environ.get(CONFIG_ENV) or "{}") or {}
    name = os.environ.get(NAME_ENV, "")
    kind, block = server_block(config, name)
    host, port = str(block.get("host") or "127.0.0.1"), block.get("port")
    if not (os.environ.get("GYMSERVE_API_KEY") or os.environ.get("GYMSERVE_API_KEY_FILE")):
        if not is_loopback(host):
            raise ConfigError(f"{name}.host: {host} is beyond loopback; NeMo-Gym's clients send no key, and a "
                              "gymserve server without one is only allowed on 127.0.0.1 or ::1")
        os.environ["GYMSERVE_NO_AUTH"] = "1"
    options = {k: v for k, v in block.items() if k not in NEMO_KEYS}
    module, server_config = load_config(kind, [], name=name, host=host, port=int(port) if port else None, spec=options)
    serve(module, server_config, kind=kind)
    return 0
