"""Real framework packages for the adapter tests, installed once per machine outside the repository
(`$GYMSERVE_CACHE_DIR/frameworks/<name>`, default `~/.cache/gymserve`), file-locked and reused
across runs. They cannot share the project's virtualenv (their pins clash with ours: OpenRLHF
0.11.2 pins flash-attn, deepspeed, ray 2.55 and transformers 5.15; verl 0.9.1 pins
transformers<5.11), so the package goes in with `--no-deps`, plus the few pure-Python modules its
code paths import; everything else comes from our venv (CPU torch 2.13.0)."""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

OPENRLHF = ("openrlhf", "0.11.2", ["pylatexenc==2.10"])
# verl's reward loop and agent loop import these; tensordict within verl's own pin (<=0.10.0)
VERL = ("verl", "0.9.1", ["tensordict==0.10.0", "pyvers==0.2.3", "codetiming==1.4.0", "hydra-core==1.3.8",
                          "omegaconf==2.4.0", "antlr4-python3-runtime==4.9.3", "pylatexenc==2.10",
                          "cloudpickle==3.1.3", "orjson==3.13.0", "cachetools==8.0.0"])


def cache_root() -> Path:
    return Path(os.environ.get("GYMSERVE_CACHE_DIR") or Path.home() / ".cache" / "gymserve") / "frameworks"


def install(name: str, version: str, extras: list[str]) -> Path:
    """`pip install --no-deps --target` once (again when `extras` change); returns the folder to put on sys.path."""
    target = cache_root() / f"{name}-{version}"
    stamp = target / ".installed"
    wanted = "\n".join(extras)
    if stamp.exists() and stamp.read_text() == wanted:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (stamp.exists() and stamp.read_text() == wanted):
                subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target",
                                str(target), f"{name}=={version}", *extras], check=True, timeout=600)
                stamp.write_text(wanted)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target
