"""NeMo-Gym 0.7.0 for the compatibility tests: its virtualenv (cached, see nemo_gym.py) and a runner."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.compat import nemo_gym


class NeMoGym:
    """Runs NeMo-Gym's commands and Python in its own virtualenv, with no gymserve variables."""

    def __init__(self, venv: Path, tmp: str) -> None:
        self.venv = venv
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("GYMSERVE_", "VIRTUAL_ENV"))}
        self.env["PYTHONUNBUFFERED"] = "1"
        # NeMo-Gym SIGKILLs its own servers when it stops them, so their temporary folders (wandb's,
        # multiprocessing's) are never removed: they go to a folder of the session's, removed at its end
        self.env["TMPDIR"] = tmp
        # where NeMo-Gym starts Ray (`gym eval reverify`): on loopback, and without writing a Ray auth token
        # into ~/.ray, which would switch token auth on for every later Ray cluster of this user
        self.env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled")

    def run(self, command: str, *args: str, cwd: Path, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.venv / "bin" / command), *args], cwd=cwd, env=self.env, text=True,
                              capture_output=True, timeout=timeout_s)

    def python_json(self, code: str, data: Any, cwd: Path) -> Any:
        """Run `code` in NeMo-Gym's Python with `data` bound to the JSON given; it prints JSON back."""
        script = f"import json, sys\ndata = json.loads(sys.stdin.read())\n{code}"
        done = subprocess.run([str(self.venv / "bin" / "python"), "-c", script], input=json.dumps(data), cwd=cwd,
                              env=self.env, text=True, capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def nemo() -> Iterator[NeMoGym]:
    with tempfile.TemporaryDirectory(prefix="ng-") as tmp:  # short: Ray's socket paths live below it
        yield NeMoGym(nemo_gym.venv(), tmp)


@pytest.fixture
def workdir():
    """NeMo-Gym's working folder (its commands write files into the current folder). Not pytest's
    tmp_path: another pytest session of the same user may prune that while a command runs in it."""
    with tempfile.TemporaryDirectory(prefix="gymserve-compat-") as path:
        yield Path(path)
