"""NeMo-Gym 0.7.0 in a virtualenv of its own, created once and reused (CI caches it between runs).

NeMo-Gym needs Python 3.13 and pins its own dependencies, so it cannot share the project's
virtualenv. The first test that needs it installs `nemo-gym==0.7.0` from the package index with
the machine's ordinary pip setup into `~/.cache/gymserve/nemo-gym-0.7.0` (or
`$GYMSERVE_NEMO_GYM_CACHE/nemo-gym-0.7.0`), under a file lock so parallel runs install it once.
"""
from __future__ import annotations

import fcntl
import glob
import os
import shutil
import subprocess
from importlib.metadata import version
from pathlib import Path

VERSION = "0.7.0"
STAMP = ".gymserve-installed"
# NeMo-Gym installs each resources server's requirements.txt beside it; these are the ones of the
# servers the differential tests run (resources_servers/{math_with_judge,reasoning_gym}/requirements.txt);
# reasoning-gym at the version installed here, so both sides score with the same task code
SERVER_REQUIREMENTS = ["math-verify==0.8.0", f"reasoning-gym=={version('reasoning_gym')}"]


def cache_root() -> Path:
    return Path(os.environ.get("GYMSERVE_NEMO_GYM_CACHE") or Path.home() / ".cache" / "gymserve")


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


def venv() -> Path:
    """The NeMo-Gym virtualenv, created when missing or half-made (a crashed install is redone)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"nemo-gym-{VERSION}"
    with open(root / f"nemo-gym-{VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = target / STAMP
        if not stamp.exists():
            shutil.rmtree(target, ignore_errors=True)
            subprocess.run([python313(), "-m", "venv", str(target)], check=True)
            # 0.7.0 declares requires-python >=3.13.14; it runs on any 3.13
            _pip(target, "--ignore-requires-python", f"nemo-gym=={VERSION}")
            stamp.write_text("")
        if stamp.read_text().split() != SERVER_REQUIREMENTS:  # a cache from before a requirement was added
            _pip(target, *SERVER_REQUIREMENTS)
            stamp.write_text("\n".join(SERVER_REQUIREMENTS))
    return target


def _pip(target: Path, *args: str) -> None:
    subprocess.run([str(target / "bin" / "python"), "-m", "pip", "install", "-q", *args], check=True, timeout=1500)


# Prepended to a script that runs NeMo-Gym's math_with_judge in its virtualenv: math-verify's default
# 5 s limits raised to the 30 s the tests give gymserve's side (`math_verify_timeout_s=30`). The
# comparisons are about answers, and on a loaded machine one of NeMo-Gym's recorded rollouts takes
# sympy about 5 s, so a limit hit on one side only would turn a slow check into a 0 there. NeMo-Gym
# forks its checker from the script's process, so the raised defaults reach it.
GENEROUS_MATH_VERIFY = """
import functools
import math_verify.metric
math_verify.metric.parse = functools.partial(math_verify.metric.parse, parsing_timeout=30)
math_verify.metric.verify = functools.partial(math_verify.metric.verify, timeout_seconds=30)
"""


def text_response(text: str) -> dict:
    """A complete Responses object whose one message says `text` (what both servers' `/verify` read)."""
    return {"id": "resp_x", "object": "response", "created_at": 1.0, "model": "policy", "status": "completed",
            "output": [{"type": "message", "id": "msg_x", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


# NeMo-Gym-style math rows: no agent_ref (its collector stamps +agent_name); the stub policy always answers 4
MATH_ROWS = [
    {"responses_create_params": {"input": [{"role": "user", "content": "What is 2+2? Answer in \\boxed{}."}]},
     "expected_answer": "4"},
    {"responses_create_params": {"input": [{"role": "user", "content": "What is 3+4? Answer in \\boxed{}."}]},
     "expected_answer": "7"},
]
