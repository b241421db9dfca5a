"""The servers' edges against a hostile client, co-tenant or upstream (real processes on 127.0.0.1):
request headers are capped in bytes before anything reads them (the key check included); the head
bounds what it holds of an upstream's reply head and of `/training/metrics` records; the dashboard
forwarder cannot be walked out of with encoded dot segments; a key holder who registers a stack
name gets no lease for it; and no secret shape comes back from the config endpoint or an error."""
from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import yaml

from gateway import dashboard as head_dashboard
from gymserve.commands import dashboard as forwarder
from gymserve.testing import ServerProcess, served_in_thread
from services.core.ports import free_port
from services.core.redaction import redact_text
from services.core.replies import failed_reply
from services.core.schemas import VerifyRequest
from tests.security.secret_shapes import HARMLESS, SHAPES

KEY = "edges-test-key-6d1f"
STACK_TOKEN = "edges-stack-token-93ab"
ENV_SECRET = "hfEnvSecret0Zq7vK2mXw9Lp4"  # the value of a secret-named variable the config refers to
MAX_HEADER_BYTES = 16 * 1024
TRAINING_MAX_BYTES = 256 * 1024


class _Hostile(BaseHTTPRequestHandler):
    """A server of the stack gone bad: replies with far more header bytes than any reply needs, and
    (once `armed`) a `/metrics` page of 64 MiB for the head's health probe."""

    armed = False

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        if self.path.startswith("/many"):
            for i in range(5000):
                self.send_header(f"X-Pad-{i}", "a" * 100)
        elif self.path.startswith("/long"):
            self.send_header("X-Long", "a" * (4 * 1024 * 1024))
        if self.path == "/metrics" and self.armed:
            size = 64 * 1024 * 1024
            self.send_header("content-length", str(size))
            self.end_headers()
            line = b"# " + b"x" * 1021 + b"\n"
            try:
                for _ in range(size // len(line)):
                    self.wfile.write(line)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture(scope="module")
def wide_upstream() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def head(wide_upstream: int) -> Iterator[ServerProcess]:
    options = {f"field_{i:02d}": text for i, (_, text, _) in enumerate(SHAPES)}
    options.update({f"plain_{i:02d}": text for i, text in enumerate(HARMLESS)})
    options["model_args"] = "${HF_TOKEN}"  # a secret by reference, under a neutral name
    stack = {"servers": {"neutral": {"kind": "models/openai_proxy", "port": free_port(), **options},
                         "em": {"kind": "resources/exact_match", "port": free_port()},
                         "wide": {"kind": "resources/exact_match", "port": wide_upstream}}}
    spec = {"stack": stack, "max_header_bytes": MAX_HEADER_BYTES, "training_max_bytes": TRAINING_MAX_BYTES,
            "health_interval_s": 60}
    env = {"GYMSERVE_SERVER_SPEC": json.dumps(spec), "GYMSERVE_API_KEY": KEY, "GYMSERVE_HEAD_URL": "",
           "GYMSERVE_STACK_TOKEN": STACK_TOKEN, "HF_TOKEN": ENV_SECRET, "GYMSERVE_ALLOWED_HOSTS": ""}
    with ServerProcess("head", name="head", env=env) as proc:
        yield proc


@pytest.fixture(scope="module")
def resource() -> Iterator[ServerProcess]:
    with ServerProcess("resources/exact_match", f"max_header_bytes={MAX_HEADER_BYTES}", name="edges-em",
                       env={"GYMSERVE_API_KEY": KEY, "GYMSERVE_HEAD_URL": ""}) as proc:
        yield proc


# ----------------------------------------------------------------------------- request header bytes

def _huge_head(port: int, path: str, total: int, *, one_line: bool) -> tuple[bytes, int]:
    """Sends a request line and headers, `total` bytes of them (many lines, or one line that never ends),
    with no key and no end, as fast as the server reads; returns what came back and how many bytes the
    server let in before it closed."""
    line = b"a" * 8000 if one_line else b"X-Pad: " + b"a" * 8000 + b"\r\n"
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{'X-Long: ' if one_line else ''}".encode())
        try:
            while sent < total:
                sock.sendall(line)
                sent += len(line)
        except (BrokenPipeError, ConnectionResetError):
            pass
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (ConnectionResetError, TimeoutError):
            pass
    return b"".join(chunks), sent


@pytest.mark.timeout(120)
@pytest.mark.parametrize("one_line", [False, True], ids=["many lines", "one endless line"])
@pytest.mark.parametrize("kind", ["resource", "head"])
def test_oversized_request_headers_are_431_before_the_key_check(kind, one_line, request):
    server: ServerProcess = request.getfixturevalue(kind)
    path = "/verify" if kind == "resource" else "/register"
    total = 64 * 1024 * 1024
    reply, sent = _huge_head(server.port, path, total, one_line=one_line)
    assert sent < total, "the server read 64 MiB of headers"
    if reply:  # the refusal is on the wire unless the close's reset overtook it
        assert reply.startswith(b"HTTP/1.1 431 "), reply[:200]
        assert b"max_header_bytes" in reply
    small = httpx.post(f"{server.url}{path}", json={}, headers={"X-Pad": "a" * (2 * MAX_HEADER_BYTES)}, timeout=30)
    assert small.status_code == 431 and "max_header_bytes" in small.json()["detail"]  # not 401: nothing read it
    assert httpx.post(f"{server.url}{path}", json={}, timeout=30).status_code == 401  # the key check still holds
    assert server.get("/health").status_code == 200  # and the server is fine


# ----------------------------------------------------------------------------- what the head buffers

@pytest.mark.parametrize("path", ["/many", "/long"])
def test_an_upstream_reply_head_beyond_the_caps_is_a_502(head, path):
    reply = head.get(f"/servers/wide{path}")
    assert reply.status_code == 502, reply.status_code
    assert "wide" in reply.json()["detail"]
    assert head.get("/health").status_code == 200


def _peak_rss_kb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


def test_a_huge_metrics_page_is_not_held_by_the_health_probe(head):
    pid = head.proc.pid  # type: ignore[union-attr]
    assert head.get("/health/servers").status_code == 200  # warm: every probe path has run once
    before = _peak_rss_kb(pid)
    _Hostile.armed = True
    try:
        report = head.get("/health/servers")
    finally:
        _Hostile.armed = False
    row = next(r for r in report.json()["servers"] if r["name"] == "wide")
    assert row["health"] == "ready" and row["requests_per_s"] is None  # its page was refused, not parsed
    assert _peak_rss_kb(pid) - before < 32 * 1024, "the head held the 64 MiB page"


def test_training_records_are_bounded_in_bytes_names_and_merged_entries(head):
    long_name = head.post("/training/metrics", {"run": "edges", "step": 0, "reward_components": {"x" * 100_000: 1.0}})
    assert long_name.status_code == 422 and "reward_components" in long_name.json()["detail"]
    first = {f"c{i:02d}": 0.5 for i in range(64)}
    assert head.post("/training/metrics", {"run": "merge", "step": 1, "reward_components": first}).status_code == 200
    more = {f"d{i:02d}": 0.5 for i in range(64)}
    grown = head.post("/training/metrics", {"run": "merge", "step": 1, "reward_components": more})
    assert grown.status_code == 422 and "at most 64" in grown.json()["detail"], grown.text
    kept = head.get("/training/metrics", params={"run": "merge"}).json()["records"]
    assert len(kept) == 1 and set(kept[0]["reward_components"]) == set(first)
    components = {f"{'n' * 190}{i:02d}": 0.25 for i in range(64)}  # about 13 KB a record
    for start in range(0, 200, 50):
        batch = [{"run": "bulk", "step": s, "reward_components": components} for s in range(start, start + 50)]
        assert head.post("/training/metrics", batch).status_code == 200
    everything = head.get("/training/metrics")
    assert len(everything.content) <= TRAINING_MAX_BYTES * 1.2
    steps = [r["step"] for r in everything.json()["records"] if r["run"] == "bulk"]
    assert steps and steps[-1] == 199 and len(steps) < 200  # the oldest went, the newest stayed


# ----------------------------------------------------------------------------- the dashboard forwarder

@pytest.fixture(scope="module")
def dashboard_url(head) -> Iterator[str]:
    app = forwarder.build(head.url, {"Authorization": f"Bearer {KEY}"})
    with served_in_thread(app, gymserve_protocol=False) as port:
        yield f"http://127.0.0.1:{port}"


ESCAPES = [
    "/dashboard/static/..%2f..%2fglobal_config_dict_yaml",
    "/dashboard/static/..%2F..%2Fserver_instances",
    "/dashboard/static/%2e%2e%2f%2e%2e%2fserver_instances",
    "/dashboard/static/%2e%2e/%2e%2e/server_instances",
    "/dashboard/static/..%5c..%5cglobal_config_dict_yaml",
    "/dashboard/static/dashboard.js%2f..%2f..%2f..%2fglobal_config_dict_yaml",
    "/dashboard/static/..%2f..%2fservers%2fem%2fhealth",
    "/dashboard/static/../../global_config_dict_yaml",
    "/dashboard/%2e%2e/server_instances",
    "/dashboard/static/%252e%252e%252fserver_instances",
    "/dashboard/static/secret.yaml",
    "/dashboard/static/",
]


def _raw_get(url: str, path: str) -> tuple[int, bytes]:
    """GET `path` exactly as written (no client normalises it)."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, data.split(b"\r\n\r\n", 1)[1]


@pytest.mark.parametrize("path", ESCAPES)
def test_the_dashboard_forwarder_cannot_be_walked_out_of(dashboard_url, path):
    status, body = _raw_get(dashboard_url, path)
    assert status == 404, (status, body[:300])
    assert b"head_server" not in body and b"server_type" not in body and b"status" not in body[:20]


def test_the_dashboard_forwarder_serves_the_dashboards_own_files(dashboard_url):
    assert forwarder.STATIC_FILES == set(head_dashboard.STATIC_FILES)
    for name in sorted(forwarder.STATIC_FILES):
        status, body = _raw_get(dashboard_url, f"/dashboard/static/{name}")
        assert status == 200 and body == (head_dashboard.STATIC_DIR / name).read_bytes()
    assert _raw_get(dashboard_url, "/dashboard/data")[0] == 200


# ----------------------------------------------------------------------------- leases

def test_a_key_holder_gets_no_lease_for_a_stack_name(head):
    em = next(r for r in head.get("/server_instances").json() if r["name"] == "em")
    reply = head.post("/register", {"name": "em", "host": "127.0.0.1", "port": em["port"], "ttl_s": 60})
    assert reply.status_code == 200 and reply.json()["lease"] is None
    for lease in (None, "guess"):
        assert head.post("/unregister", {"name": "em", "lease": lease}).status_code == 403
    assert next(r for r in head.get("/server_instances").json() if r["name"] == "em")["status"] != "stale"
    owner = head.post("/register", {"name": "em", "host": "127.0.0.1", "port": em["port"], "ttl_s": 60},
                      headers={"X-Gymserve-Stack-Token": STACK_TOKEN})
    assert owner.status_code == 200 and owner.json()["lease"]  # the stack's launcher owns it


# ----------------------------------------------------------------------------- redaction

def _assert_no_secret(text: str) -> None:
    leaked = [shape for shape, _, secret in SHAPES if secret in text]
    assert not leaked and ENV_SECRET not in text, (leaked, text[:2000])


def test_the_config_endpoint_shows_no_secret_shape(head):
    assert len(SHAPES) >= 24
    reply = head.get("/global_config_dict_yaml")
    assert reply.status_code == 200
    _assert_no_secret(reply.text)
    shown = yaml.safe_load(reply.json())["neutral"]["responses_api_models"]["openai_proxy"]
    assert shown["model_args"] == "***"
    assert [shown[f"plain_{i:02d}"] for i in range(len(HARMLESS))] == HARMLESS  # what is not secret stays
    for i, (_, text, _) in enumerate(SHAPES):
        assert shown[f"field_{i:02d}"] not in ("", None) and "***" in shown[f"field_{i:02d}"], text


@pytest.mark.parametrize("shape, text, secret", SHAPES, ids=[s[0] for s in SHAPES])
def test_error_replies_show_no_secret_shape(head, shape, text, secret):
    """The proxy's 404 quotes the server name it was asked for: here, a secret of each shape."""
    reply = head.get(f"/servers/{quote(text, safe='')}/x")
    assert reply.status_code == 404 and "no server named" in reply.json()["detail"], reply.text
    assert secret not in reply.text, reply.text


def test_an_error_quoting_a_referenced_secret_hides_it(head):
    reply = head.get(f"/servers/{ENV_SECRET}/x")
    assert reply.status_code == 404 and ENV_SECRET not in reply.text


def test_failure_reasons_show_no_secret_shape():
    request = VerifyRequest.model_validate({"responses_create_params": {"input": "x"},
                                            "response": {"output": []}})
    for shape, text, secret in SHAPES:
        reply = failed_reply(request, "upstream", f"upstream call failed: {text}").dump()
        assert secret not in json.dumps(reply), shape
        assert secret not in redact_text(text), shape
