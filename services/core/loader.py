"""Find a server implementation by kind.

A kind names an object with `Config` (a ServerConfig subclass) and `build(config) -> FastAPI`. It
is resolved, in order, by:

- the tree: `head` is `gateway/app.py`; `resources/math`, `agents/simple_agent`, `models/hf` are
  `services/<family>/<name>/app.py`;
- an installed package: `module:attribute` (e.g. `my_env.app:server`, or `my_env.app` itself with
  `my_env:app`), or the name of an entry point of group `gymserve.environments` whose value loads
  that object.

A package's server is a resource server when its `Config` derives from `ResourceConfig`; an agent or
model backend says so with `family = "agents"` or `"models"` beside `Config` and `build`. Another
family of kinds (one a launcher serves its own way) adds its prefix check before these.
"""
from __future__ import annotations

import importlib
import pkgutil
import re
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from .config import ConfigError

FAMILIES = ("resources", "agents", "models")
ENTRY_POINT_GROUP = "gymserve.environments"
_KIND = re.compile(r"^(resources|agents|models)/[a-z0-9_]+$")
_MODULE_ATTR = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_SERVICES = Path(__file__).resolve().parent.parent


def is_package_kind(kind: str) -> bool:
    """A kind served from an installed package rather than from this tree."""
    return kind != "head" and not _KIND.match(kind) and (bool(_MODULE_ATTR.match(kind)) or "/" not in kind)


def module_name(kind: str) -> str:
    if kind == "head":
        return "gateway.app"
    if not _KIND.match(kind):
        raise ConfigError(f"unknown server kind {kind!r}: expected head or one of "
                          f"{', '.join(available_kinds())}")
    return "services." + kind.replace("/", ".") + ".app"


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load_package(kind: str) -> Any:
    if _MODULE_ATTR.match(kind):
        module, _, attribute = kind.partition(":")
        try:
            found: Any = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                raise ConfigError(f"server kind {kind!r}: no module {module!r} is installed") from None
            raise
        for part in attribute.split("."):
            if not hasattr(found, part) and isinstance(found, ModuleType):  # a submodule not imported yet
                try:
                    importlib.import_module(f"{found.__name__}.{part}")
                except ModuleNotFoundError:
                    pass
            if not hasattr(found, part):
                raise ConfigError(f"server kind {kind!r}: {module} has no attribute {attribute!r}")
            found = getattr(found, part)
        return found
    entry = _entry_points().get(kind)
    if entry is None:
        raise ConfigError(f"unknown server kind {kind!r}: expected head, one of {', '.join(available_kinds())}, "
                          f"module:attribute, or an entry point of group {ENTRY_POINT_GROUP} "
                          f"(installed: {', '.join(sorted(_entry_points())) or 'none'})")
    return entry.load()


def load_server(kind: str) -> Any:
    """The object serving `kind` (a module, or any object with `Config` and `build`)."""
    if is_package_kind(kind):
        module: Any = _load_package(kind)
        name = kind
    else:
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


def package_family(kind: str) -> str:
    """`resources`, `agents` or `models` for a package kind (see the module docstring)."""
    from .resource import ResourceConfig

    server = load_server(kind)
    family = getattr(server, "family", None)
    if family in FAMILIES:
        return str(family)
    return "resources" if issubclass(server.Config, ResourceConfig) else "unknown"


def available_kinds() -> list[str]:
    kinds = []
    for family in FAMILIES:
        folder = _SERVICES / family
        for info in pkgutil.iter_modules([str(folder)]):
            if info.ispkg and (folder / info.name / "app.py").exists():
                kinds.append(f"{family}/{info.name}")
    return sorted(kinds)


__all__ = ["ENTRY_POINT_GROUP", "FAMILIES", "ModuleType", "available_kinds", "is_package_kind", "load_server",
           "module_name", "package_family"]
