"""A request whose client went away is cancelled, down the whole chain (services/core/middleware/disconnect.py):
a caller that gives up on an agent's rollout leaves neither the agent nor the model behind it working for
nobody. Real servers: `models/stub` scripted to sleep 600 s, `resources/exact_match`, `agents/simple_agent`."""
from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import Request

from gymserve.testing import ServerProcess
from services.core.app import create_app
from services.core.config import ServerConfig
from services.core.ports import free_port
from services.core.serving import guarded_protocol

# the stub's reply would come only after 600 s: within the test's timeout, only a cancellation ends the request
SLEEPER = {"responses_create_params": {"input": [{"role": "user", "content": "q"}],
                                       "metadata": {"stub_script": json.dumps([{"sleep": 600, "text": "late"}])}},
           "expected_answer": "late"}


def _metric(server: ServerProcess, name: str, **labels: str) -> float:
    text = server.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if m and ",".join(sorted((m.group(1) or "").split(","))) == want:
            return float(m.group(2))
    return 0.0


def _wait_cancelled(server: ServerProcess, path: str) -> None:
    """Until the server counts `path` as cancelled unanswered (499) and has nothing but this probe in flight."""
    while not (_metric(server, "gymserve_requests_total", method="POST", path=path, status="499") == 1.0
               and _metric(server, "gymserve_requests_in_flight") == 1.0):
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_a_caller_giving_up_cancels_the_agent_and_the_model_call_behind_it():
    with ServerProcess("models/stub") as stub, ServerProcess("resources/exact_match", "workers=1") as exact, \
            ServerProcess("agents/simple_agent", f"resources_url={exact.url}", f"model_url={stub.url}",
                          "rollout_deadline_s=600", "step_deadline_s=600") as agent:
        with pytest.raises(httpx.ReadTimeout):
            agent.post("/run", SLEEPER, timeout=2)
        _wait_cancelled(agent, "/run")
        _wait_cancelled(stub, "/v1/responses")
        # the servers go on answering
        assert stub.post("/v1/responses", {"input": "q"}).json()["output"][0]["content"][0]["text"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("served_by", ["gymserve's protocol", "plain uvicorn"])
def test_a_lost_connection_cancels_its_request_under_either_server(served_by: str) -> None:
    """gymserve's protocol tells the request its connection is gone (no watcher task per request); under
    any other server (Ray Serve's proxy, plain uvicorn) a watcher task waits for the disconnect message."""
    seen: dict[str, object] = {}
    cancelled = threading.Event()
    app = create_app(ServerConfig(name="unit", kind="resources/unit", head_url=None))

    @app.post("/slow")
    async def slow(request: Request) -> dict:
        await request.body()
        seen["hooked"] = "gymserve.disconnect" in (request.scope.get("extensions") or {})
        seen["watchers"] = sum(t.get_coro().__name__ == "watch" for t in asyncio.all_tasks())  # type: ignore[union-attr]
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    port = free_port()
    options = {"http": guarded_protocol(10.0)} if served_by == "gymserve's protocol" else {}
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical",
                                           timeout_graceful_shutdown=1, **options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "test server did not start"
            time.sleep(0.05)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"http://127.0.0.1:{port}/slow", json={"q": 1}, timeout=1)
        assert cancelled.wait(10), "the request went on after its client had gone"
        hooked = served_by == "gymserve's protocol"
        assert seen == {"hooked": hooked, "watchers": 0 if hooked else 1}
    finally:
        server.should_exit = True
        thread.join(timeout=10)
