"""Run `gymserve up` as a real subprocess and watch its output (shared by the test_up* modules)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

STACK = Path(__file__).parent / "stacks" / "head_test.yaml"


class Up:
    def __init__(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.env.pop("GYMSERVE_HEAD_URL", None)
        self.proc = subprocess.Popen([sys.executable, "-m", "gymserve", "up", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=self.env, text=True, start_new_session=True,
                                     cwd=cwd)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout_s: float = 90.0) -> re.Match[str]:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = regex.search(line)
                if match:
                    return match
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r} in gymserve up output:\n{self.output[-4000:]}")

    def count(self, pattern: str) -> int:
        regex = re.compile(pattern)
        return sum(1 for line in list(self.lines) if regex.search(line))

    def wait(self, timeout_s: float = 60.0) -> int:
        code = self.proc.wait(timeout_s)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def children(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
