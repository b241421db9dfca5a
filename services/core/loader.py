"""Find a server implementation by kind (`resources/math`, `agents/simple_agent`, `head`).

Convention: `services/<family>/<name>/app.py` defines `Config` (a ServerConfig subclass)
and `build(config) -> FastAPI`. The head lives in `gateway/app.py` with the same two names.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from types import ModuleType

from .config import ConfigError

FAMILIES = ("resources", "agents", "models")
_KIND = re.compile(r"^(resources|agents|models)/[a-z0-9_]+$")
_SERVICES = Path(__file__).resolve().parent.parent


def module_name(kind: str) -> str:
    if kind == "head":
        return "gateway.app"
    if not _KIND.match(kind):
        raise ConfigError(f"unknown server kind {kind!r}: expected head or one of "
                          f"{', '.join(available_kinds())}")
    return "services." + kind.replace("/", ".") + ".app"


def load_server(kind: str) -> ModuleType:
    name = module_name(kind)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise ConfigError(f"unknown server kind {kind!r}: expected head or one of "
                              f"{', '.join(available_kinds())}") from None
        raise
    for attr in ("Config", "build"):
        if not hasattr(module, attr):
            raise ConfigError(f"{name} must define {attr}")
    return module


def available_kinds() -> list[str]:
    kinds = []
    for family in FAMILIES:
        folder = _SERVICES / family
        for info in pkgutil.iter_modules([str(folder)]):
            if info.ispkg and (folder / info.name / "app.py").exists():
                kinds.append(f"{family}/{info.name}")
    return sorted(kinds)
