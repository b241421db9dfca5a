"""The protocol clients the binding tests drive gymserve with, each in a virtualenv of its own.

`openenv` 0.10.0 (its `GenericEnvClient` and `openenv validate`) requires fastmcp 3, which pins
`mcp` < 2, so it cannot share a virtualenv with the `mcp` 2.3.0 client (nor with the project's).
Each is installed once per machine into `~/.cache/gymserve/<name>-<version>` (or under
`$GYMSERVE_CACHE_DIR`), under a file lock, with a stamp file, and reused by later runs and CI.
A test runs a short script in that virtualenv's Python (`run_script`) and reads its JSON output.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

OPENENV = ("openenv", "0.10.0")
MCP = ("mcp", "2.3.0")
STAMP = ".gymserve-installed"


def cache_root() -> Path:
    return Path(os.environ.get("GYMSERVE_CACHE_DIR") or Path.home() / ".cache" / "gymserve")


def client_venv(name: str, version: str) -> Path:
    """The virtualenv holding `name==version`, created when missing or half-made."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{name}-{version}"
    with open(root / f"{name}-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / STAMP).exists():
            shutil.rmtree(target, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(target)], check=True, timeout=300)
            subprocess.run([str(target / "bin" / "python"), "-m", "pip", "install", "-q", f"{name}=={version}"],
                           check=True, timeout=1500)
            (target / STAMP).write_text(f"{name}=={version}\n")
    return target


def run_script(venv: Path, script: str, payload: Any, *, timeout_s: float = 300, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    """`script` in the virtualenv's Python with `payload` as JSON on stdin (outside the project: its
    folder is not on the path, so only the client package and the script's own code run)."""
    return subprocess.run([str(venv / "bin" / "python"), "-c", script], input=json.dumps(payload), text=True,
                          capture_output=True, timeout=timeout_s, cwd=str(venv),
                          env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **(env or {})})


def last_json(proc: subprocess.CompletedProcess[str]) -> Any:
    assert proc.returncode == 0, f"client script failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
