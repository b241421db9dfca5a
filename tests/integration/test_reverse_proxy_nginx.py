"""A real nginx as the stack's front door (`gymserve.nginx_conf`): the config rendered from the head's
`GET /server_instances` routes `/servers/<name>/...` straight to each server, keeps a registered URL's
path prefix, passes the client's key (every server checks it), streams SSE events as they are
written, and answers any other path with a JSON 404. nginx is Debian's (`nginx-light`), installed
here when missing (as root, as CI runs)."""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from gymserve.nginx_conf import render
from gymserve.testing import ServerProcess, served_in_thread, verify_body
from services.core.ports import free_port

KEY = "nginx-front-door-key"


def nginx_binary() -> str:
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
    if found is None:
        lock = Path(tempfile.gettempdir()) / "gymserve-apt.lock"
        subprocess.run(["flock", str(lock), "bash", "-c",
                        "command -v nginx || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                        "apt-get install -y -qq --no-install-recommends nginx-light)"],
                       check=True, capture_output=True, timeout=900)
        found = shutil.which("nginx") or "/usr/sbin/nginx"
    return found


def _sse_app(release: threading.Event) -> FastAPI:
    app = FastAPI()

    @app.get("/app/events")
    async def events(request: Request) -> StreamingResponse:
        async def gen():
            yield f"data: {request.headers.get('x-forwarded-prefix')}\n\n".encode()
            while not release.is_set():  # the rest only once the client has seen the first event
                await asyncio.sleep(0.01)
            yield b"data: [DONE]\n\n"
        return StreamingResponse(gen(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def front_door() -> Iterator[tuple[str, ServerProcess, threading.Event]]:
    binary = nginx_binary()
    release = threading.Event()
    env = {"GYMSERVE_API_KEY": KEY, "GYMSERVE_HEAD_URL": ""}
    with ServerProcess("resources/exact_match", name="em", env=env) as em, \
            served_in_thread(_sse_app(release), gymserve_protocol=False) as sse_port:
        spec = {"stack": {"servers": {"em": {"kind": "resources/exact_match", "port": em.port}}}}
        with ServerProcess("head", name="head", env={**env, "GYMSERVE_SERVER_SPEC": json.dumps(spec)}) as head, \
                tempfile.TemporaryDirectory(prefix="gymserve-nginx-") as where:
            assert head.post("/register", {"name": "sse", "url": f"http://127.0.0.1:{sse_port}/app",
                                           "ttl_s": 600}).status_code == 200
            port = free_port()
            rows = head.get("/server_instances").json()
            (Path(where) / "gymserve.conf").write_text(render(rows, listen=f"127.0.0.1:{port}"))
            (Path(where) / "nginx.conf").write_text(
                f"daemon off;\npid {where}/nginx.pid;\nerror_log stderr;\nevents {{}}\n"
                f"http {{\n  access_log off;\n  client_body_temp_path {where}/body;\n  proxy_temp_path {where}/proxy;\n"
                f"  include {where}/gymserve.conf;\n}}\n")
            proc = subprocess.Popen([binary, "-c", f"{where}/nginx.conf", "-p", where],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            url = f"http://127.0.0.1:{port}"
            try:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        httpx.get(f"{url}/", timeout=2)
                        break
                    except httpx.HTTPError:
                        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
                        time.sleep(0.1)
                yield url, em, release
            finally:
                proc.terminate()
                proc.wait(timeout=30)


def test_a_server_is_reached_through_nginx_with_the_clients_key(front_door) -> None:
    url, em, _ = front_door
    body = verify_body("Paris", expected_answer="paris")
    via = httpx.post(f"{url}/servers/em/verify", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    direct = em.post("/verify", json=body)
    assert via.status_code == 200 and via.json()["reward"] == direct.json()["reward"] == 1.0
    keyless = httpx.post(f"{url}/servers/em/verify", json=body, timeout=30)
    assert keyless.status_code == 401  # nginx adds no key; the server checks it


def test_sse_streams_through_nginx_under_the_registered_prefix(front_door) -> None:
    url, _, release = front_door
    with httpx.stream("GET", f"{url}/servers/sse/events", timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        assert next(line for line in lines if line) == "data: /servers/sse"  # before the upstream finished
        release.set()
        assert [line for line in lines if line] == ["data: [DONE]"]


def test_other_paths_are_a_json_404(front_door) -> None:
    url, _, _ = front_door
    for path in ("/", "/server_instances", "/servers/nobody/health"):
        reply = httpx.get(f"{url}{path}", timeout=30)
        assert reply.status_code == 404 and "/servers/<name>/<path>" in reply.json()["detail"], path


def test_the_documented_config_is_what_render_writes() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "deployment" / "reverse-proxy.md").read_text()
    shown = page.split("```nginx\n", 1)[1].split("```", 1)[0]
    rendered = render([{"name": "math", "url": "http://127.0.0.1:11001"}], listen="127.0.0.1:8080")
    assert rendered.split("\n", 1)[1] == shown  # all but the generated-by comment
