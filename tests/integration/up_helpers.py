"""Run `gymserve up` as a real subprocess and watch its output (shared by the test_up* modules).

With no key given, `gymserve up` generates one into GYMSERVE_API_KEY_FILE: here a file in a
temporary folder of the test's own (removed when the stack is stopped), never the user's default
key file, unless the test passes GYMSERVE_API_KEY_FILE itself; `Up.auth` is the header to send.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from services.core.ports import free_port

STACK = Path(__file__).parent / "stacks" / "head_test.yaml"


def default_key_file(env: dict[str, str]) -> Path:
    """Where `gymserve up` with `env` writes a generated key when GYMSERVE_API_KEY_FILE is empty."""
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME", str(Path.home()))) / ".config")
    return Path(base) / "gymserve" / "api_key"


class Up:
    def __init__(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
                 python: str = sys.executable) -> None:
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.env.pop("GYMSERVE_HEAD_URL", None)
        self._key_dir: str | None = None
        if not self.env.get("GYMSERVE_API_KEY") and "GYMSERVE_API_KEY_FILE" not in (env or {}):
            self._key_dir = tempfile.mkdtemp(prefix="gymserve-key-")
            self.env["GYMSERVE_API_KEY_FILE"] = os.path.join(self._key_dir, "api_key")
        self.proc = subprocess.Popen([python, "-m", "gymserve", "up", *args], stdout=subprocess.PIPE,
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
    def key(self) -> str | None:
        if self.env.get("GYMSERVE_API_KEY"):
            return self.env["GYMSERVE_API_KEY"]
        path = Path(self.env.get("GYMSERVE_API_KEY_FILE") or default_key_file(self.env))
        return path.read_text().strip() if path.is_file() else None

    @property
    def auth(self) -> dict[str, str]:
        """The Authorization header the stack wants (its generated key)."""
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def _cleanup(self) -> None:
        if self._key_dir is not None and self.proc.poll() is not None:
            shutil.rmtree(self._key_dir, ignore_errors=True)
            self._key_dir = None

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
        self._cleanup()
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._cleanup()


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


def dashboard_forwarder(head: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """`gymserve dashboard` against `head` on a free loopback port, once it answers `/health`."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gymserve", "dashboard", "--head", head, "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{url}/health", timeout=2)
            return proc, url
        except httpx.HTTPError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.1)
