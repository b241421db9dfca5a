"""NeMo-Gym 0.7.0's virtualenvs, created once and reused (CI caches them between runs on a machine).

NeMo-Gym needs Python 3.13 and pins its own dependencies, so it cannot share the project's
virtualenv. The base virtualenv holds `nemo-gym==0.7.0` from the package index, installed with the
machine's ordinary pip setup into `~/.cache/gymserve/nemo-gym-0.7.0` (or
`$GYMSERVE_NEMO_GYM_CACHE/nemo-gym-0.7.0`). A resources server whose `requirements.txt` names more
than NeMo-Gym itself gets a virtualenv of its own layered on the base one (a `.pth` file puts the
base's packages behind its own), as NeMo-Gym gives each server its own: its requirements go there,
so one server's pins never change another's. Everything is built under a file lock (parallel runs
build once) and marked done by a stamp file (a crashed build is redone).
"""
from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterable

VERSION = "0.7.0"
STAMP = ".gymserve-installed"
Say = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"[gymserve] {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    return Path(os.environ.get("GYMSERVE_NEMO_GYM_CACHE") or Path.home() / ".cache" / "gymserve")


def base_path() -> Path:
    return cache_root() / f"nemo-gym-{VERSION}"


def is_built() -> bool:
    return (base_path() / STAMP).exists()


def python313() -> str:
    """A working Python 3.13: one pyenv installed, or one on PATH (a pyenv shim may not run)."""
    pyenv = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    candidates = [*sorted(glob.glob(f"{pyenv}/versions/3.13*/bin/python3.13"), reverse=True),
                  shutil.which("python3.13")]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 13)"],
                               capture_output=True)
        if probe.returncode == 0:
            return candidate
    raise RuntimeError("NeMo-Gym 0.7.0 needs Python 3.13: none on PATH nor under pyenv (pyenv install 3.13)")


def base_venv(extra: Iterable[str] = (), *, say: Say = _stderr) -> Path:
    """The base virtualenv, built when missing or half-made; `extra` requirements are added to it once
    (the compatibility tests' servers, which share it)."""
    extra = list(extra)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = base_path()
    with open(root / f"nemo-gym-{VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = target / STAMP
        if not stamp.exists():
            say(f"building NeMo-Gym {VERSION}'s virtualenv in {target} (first use only; takes minutes)")
            shutil.rmtree(target, ignore_errors=True)
            subprocess.run([python313(), "-m", "venv", str(target)], check=True)
            # 0.7.0 declares requires-python >=3.13.14; it runs on any 3.13
            _pip(target, "--ignore-requires-python", f"nemo-gym=={VERSION}")
            stamp.write_text("")
            say(f"NeMo-Gym {VERSION}'s virtualenv is ready")
        have = set(stamp.read_text().split())
        if extra and not set(extra) <= have:  # a cache from before a requirement was added
            _pip(target, *extra)
            stamp.write_text("\n".join(sorted(have | set(extra))))
    return target


def site_packages(venv: Path) -> Path:
    [found] = glob.glob(str(venv / "lib" / "python3.*" / "site-packages"))
    return Path(found)


def own_requirements(requirements_txt: Path) -> list[str]:
    """A server's requirements beyond NeMo-Gym itself (its `-e nemo-gym[dev] @ ../../` line), comments cut."""
    lines = []
    for raw in requirements_txt.read_text().splitlines() if requirements_txt.exists() else []:
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#") or line.startswith("-e"):
            continue
        lines.append(line)
    return lines


def server_venv(server: str, requirements: list[str], *, say: Say = _stderr) -> Path:
    """The virtualenv `server` runs in: the base one when it needs nothing more, else its own layer on
    the base, keyed by its requirements (a changed list is a new build). A failed install raises
    `subprocess.CalledProcessError` with pip's output."""
    base = base_venv(say=say)
    if not requirements:
        return base
    digest = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    root = cache_root() / f"nemo-gym-{VERSION}-servers"
    root.mkdir(parents=True, exist_ok=True)
    target = root / server
    with open(root / f"{server}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = target / STAMP
        if not (stamp.exists() and stamp.read_text() == digest):
            say(f"building the virtualenv of NeMo-Gym's {server} in {target} (its requirements.txt: "
                f"{' '.join(requirements)}; first use only)")
            shutil.rmtree(target, ignore_errors=True)
            subprocess.run([str(base / "bin" / "python"), "-m", "venv", "--without-pip", str(target)], check=True)
            # the base's packages behind the server's own: a pin of the server's wins in its virtualenv
            (site_packages(target) / "_nemo_gym_base.pth").write_text(f"{site_packages(base)}\n")
            try:
                _pip(target, *requirements, python=str(target / "bin" / "python"), pip_of=base)
            except subprocess.CalledProcessError:
                shutil.rmtree(target, ignore_errors=True)
                raise
            stamp.write_text(digest)
            say(f"NeMo-Gym's {server} virtualenv is ready")
    return target


def _pip(target: Path, *args: str, python: str | None = None, pip_of: Path | None = None) -> None:
    """pip install into `target` (the base's pip for a layered virtualenv, which has none of its own)."""
    if pip_of is not None:
        cmd = [str(pip_of / "bin" / "python"), "-m", "pip", "--python", python or str(target / "bin" / "python")]
    else:
        cmd = [str(target / "bin" / "python"), "-m", "pip"]
    done = subprocess.run([*cmd, "install", "-q", "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=1500)
    if done.returncode:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
