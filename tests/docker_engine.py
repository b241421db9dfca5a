"""The Docker engine and the workspace image for the docker sandbox provider's tests: the engine is
installed and started when missing (as root; CI is root) and stopped again if this started it; the
image is built offline from Debian packages by deploy/docker/sandbox.sh, only when missing."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
PREPARE = ('source deploy/docker/engine.sh && gymserve_engine >&2 && echo "engine=$ENGINE_STARTED" '
           '&& bash deploy/docker/sandbox.sh')


def engine_and_image() -> Iterator[str]:
    """Yields the workspace image's tag (generator body of a module-scoped fixture)."""
    out = subprocess.run(["bash", "-c", PREPARE], cwd=ROOT, capture_output=True, text=True, timeout=3000)
    assert out.returncode == 0, f"docker engine or image unavailable:\n{out.stderr[-4000:]}"
    lines = out.stdout.split()
    started = next((line.split("=", 1)[1] for line in lines if line.startswith("engine=")), "")
    try:
        yield lines[-1]
    finally:
        if started:
            os.kill(int(started), signal.SIGTERM)
            for _ in range(100):
                try:
                    os.kill(int(started), 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)


def containers(label: str = "gymserve.sandbox") -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={label}"], capture_output=True, text=True,
                         timeout=60)
    return out.stdout.split()
