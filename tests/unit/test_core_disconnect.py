"""A request whose client went away is cancelled, down the whole chain (services/core/middleware/disconnect.py):
a caller that gives up on an agent's rollout leaves neither the agent nor the model behind it working for
nobody. Real servers: `models/stub` scripted to sleep 600 s, `resources/exact_match`, `agents/simple_agent`."""
from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from gymserve.testing import ServerProcess

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
