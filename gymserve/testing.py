"""Real servers for tests and benchmarks: `gymserve serve` subprocesses on 127.0.0.1, or an app served
in a thread of the test's own process (to look into it while it serves)."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

from services.core.ports import free_port


class ServerProcess:
    """`python -m gymserve serve KIND ...` in a subprocess; waits for `/ready`.

    Use as a context manager; `url` is the base URL, `log()` the combined output so far.
    """

    def __init__(self, kind: str, *overrides: str, name: str | None = None, port: int | None = None,
                 env: dict[str, str] | None = None, ready_timeout_s: float = 120.0, keep_log: bool = False,
                 cwd: str | Path | None = None) -> None:
        self.kind = kind
        self.name = name or kind.rsplit("/", 1)[-1]
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.overrides = list(overrides)
        self.env = {**os.environ, **(env or {})}
        self.env.setdefault("PYTHONUNBUFFERED", "1")
        self.ready_timeout_s = ready_timeout_s
        self.cwd = cwd  # another checkout here runs that checkout's code (`python -m` imports from the cwd)
        self._logfile = tempfile.NamedTemporaryFile("w+", prefix=f"gymserve-{self.name}-", suffix=".log",
                                                    delete=False)
        self.keep_log = keep_log  # False: the log file is removed once the server is stopped (log() still reads it)
        self._final_log: str | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "ServerProcess":
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> "ServerProcess":
        """Start the process without waiting (several servers can then start side by side)."""
        cmd = [sys.executable, "-m", "gymserve", "serve", self.kind, "--port", str(self.port), "--name", self.name,
               *self.overrides]
        self.proc = subprocess.Popen(cmd, stdout=self._logfile, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=self.cwd, start_new_session=True)
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                log = self.log()
                self.stop()
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{log[-4000:]}")
            try:
                r = httpx.get(f"{self.url}/ready", timeout=2.0)
                # Another process may have taken the port first: only our server's name counts.
                if r.status_code == 200 and _served_name(r) in (None, self.name):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        log = self.log()
        self.stop()
        raise TimeoutError(f"{self.name} not ready after {self.ready_timeout_s}s:\n{log[-4000:]}")

    def log(self) -> str:
        path = Path(self._logfile.name)
        if path.exists():
            return path.read_text(errors="replace")
        return self._final_log or ""

    def headers(self, **extra: str) -> dict[str, str]:
        """The server's own key (GYMSERVE_API_KEY, else its GYMSERVE_API_KEY_FILE) as a bearer header."""
        key = self.env.get("GYMSERVE_API_KEY")
        if not key and self.env.get("GYMSERVE_API_KEY_FILE"):
            with contextlib.suppress(OSError):
                key = Path(self.env["GYMSERVE_API_KEY_FILE"]).read_text().strip()
        return {**({"Authorization": f"Bearer {key}"} if key else {}), **extra}

    def post(self, path: str, json: Any = None, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("timeout", 60.0)
        headers = {**self.headers(), **kwargs.pop("headers", {})}
        return httpx.post(f"{self.url}{path}", json=json, headers=headers, **kwargs)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("timeout", 60.0)
        headers = {**self.headers(), **kwargs.pop("headers", {})}
        return httpx.get(f"{self.url}{path}", headers=headers, **kwargs)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        try:
            return self._terminate(timeout_s)
        finally:
            if not self.keep_log and self._final_log is None:
                self._final_log = self.log()
                self._logfile.close()
                Path(self._logfile.name).unlink(missing_ok=True)

    def _terminate(self, timeout_s: float) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        with _suppress():
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with _suppress():
                os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(5)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _served_name(response: httpx.Response) -> str | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get("name") if isinstance(body, dict) and isinstance(body.get("name"), str) else None


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return exc[0] is not None and issubclass(exc[0], ProcessLookupError)


@contextlib.contextmanager
def hung_server() -> Iterator[tuple[int, list[socket.socket]]]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers (timeouts, 504s).
    Yields (port, the connections accepted so far); closes everything on exit."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1], held
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        sock.close()


@contextlib.contextmanager
def served_in_thread(app: Any, *, port: int | None = None, gymserve_protocol: bool = True) -> Iterator[int]:
    """`app` served by uvicorn on 127.0.0.1 in a thread, as `gymserve serve` serves it (its header deadline
    and header byte cap, the app's config's where it has one) or, with `gymserve_protocol=False`, by plain
    uvicorn (as under another server), on `port` or a free one. Yields the port; stops the server on exit."""
    import uvicorn

    from services.core.serving import guarded_protocol

    options: dict[str, Any] = {}
    if gymserve_protocol:
        config = getattr(getattr(app, "state", None), "config", None)
        options["http"] = guarded_protocol(getattr(config, "header_timeout_s", 10.0),
                                           getattr(config, "max_header_bytes", 64 * 1024))
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           timeout_graceful_shutdown=1, **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def response_with_text(text: str) -> dict[str, Any]:
    """A Responses API response object whose assistant message says `text`."""
    return {
        "id": "resp_test", "object": "response", "status": "completed", "model": "test",
        "output": [{"type": "message", "role": "assistant", "id": "msg_test", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}],
    }


def verify_body(text: str, **fields: Any) -> dict[str, Any]:
    """A `/verify` body for a row with `fields` and a response saying `text`."""
    return {"responses_create_params": {"input": [{"role": "user", "content": "q"}]},
            "response": response_with_text(text), **fields}
