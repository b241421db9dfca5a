"""What the nemo-gym wheel ships for one resources server: its folder, config block, requirements and
example rows, read from the installed package (the files NeMo-Gym's own launcher reads)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from services.core.config import ConfigError

from .venv import own_requirements, site_packages

RESOURCES = "resources_servers"


@dataclass(frozen=True)
class ServerFiles:
    """One resources server of the wheel: `name` is its folder, `instance` the top-level name its
    config gives it, `impl` the implementation key under `resources_servers`, `block` its options."""

    name: str
    folder: Path
    config_file: Path | None
    instance: str
    impl: str
    block: dict[str, Any]
    requirements: list[str]

    @property
    def app(self) -> Path:
        return self.folder / str(self.block.get("entrypoint") or "app.py")

    def example_rows(self) -> list[dict[str, Any]]:
        return _jsonl(self.folder / "data" / "example.jsonl")

    def example_rollouts(self) -> list[dict[str, Any]]:
        return _jsonl(self.folder / "data" / "example_rollouts.jsonl")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def package_root(venv: Path) -> Path:
    return site_packages(venv) / RESOURCES


def server_names(root: Path) -> list[str]:
    """Every server folder (most start from `app.py`; a few name another entrypoint in their config)."""
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and not p.name.startswith("_") and ((p / "app.py").exists() or (p / "configs").is_dir()))


def resources_block(config: dict[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
    """(instance, impl, block) of the first resources server a NeMo-Gym config file defines."""
    for instance, entry in config.items():
        if isinstance(entry, dict) and isinstance(entry.get(RESOURCES), dict):
            for impl, block in entry[RESOURCES].items():
                if isinstance(block, dict):
                    return str(instance), str(impl), block
    return None


def config_file(folder: Path) -> Path | None:
    """The server's own config (`configs/<name>.yaml`), else the first config defining a resources server."""
    configs = sorted((folder / "configs").glob("*.yaml"))
    own = folder / "configs" / f"{folder.name}.yaml"
    for path in ([own] if own in configs else []) + configs:
        try:
            if resources_block(yaml.safe_load(path.read_text()) or {}):
                return path
        except yaml.YAMLError:
            continue
    return None


def server_files(root: Path, name: str) -> ServerFiles:
    folder = root / name
    if folder.name.startswith("_") or not folder.is_dir() or name not in server_names(root):
        known = ", ".join(server_names(root)) if root.exists() else "(none)"
        raise ConfigError(f"nemo_gym/{name}: NeMo-Gym's wheel has no resources server {name!r}; it has: {known}")
    path = config_file(folder)
    found = resources_block(yaml.safe_load(path.read_text()) or {}) if path else None
    instance, impl, block = found or (name, name, {"entrypoint": "app.py"})
    return ServerFiles(name=name, folder=folder, config_file=path, instance=instance, impl=impl, block=dict(block),
                       requirements=own_requirements(folder / "requirements.txt"))
