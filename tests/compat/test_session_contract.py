"""NeMo-Gym 0.7.0's own session contract test passes against every gymserve environment, running.

`nemo_gym.testing.session_conformance.check_resources_session_contract` takes a FastAPI app and drives
it with a TestClient. In NeMo-Gym's virtualenv we hand it a pass-through app that relays every request
(headers and cookies included) to one of our real servers on 127.0.0.1, so NeMo-Gym's own function,
request models and assertions check our servers over the wire. `tests/security/test_sessions_nemo_contract.py`
runs a port of the same function in-process, beside our other session tests.
"""
from __future__ import annotations

from typing import Any

from tests.contract.servers import ENVIRONMENTS, ROOT, examples, running_environments

NEMO_CONTRACT = """
import httpx
from fastapi import FastAPI, Request, Response
from nemo_gym.base_resources_server import ResourcesSeedSessionRequest
from nemo_gym.testing.session_conformance import check_resources_session_contract

DROP = {"host", "content-length", "transfer-encoding", "connection"}


def relay(url, key):
    upstream = httpx.Client(base_url=url, timeout=120)
    app = FastAPI()

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in DROP}
        if key:
            headers["authorization"] = f"Bearer {key}"
        reply = upstream.request(request.method, "/" + path, content=await request.body(), headers=headers)
        back = [(k, v) for k, v in reply.headers.multi_items() if k.lower() not in DROP | {"content-encoding"}]
        response = Response(reply.content, status_code=reply.status_code)
        for k, v in back:
            response.headers.append(k, v)
        return response
    return app


results = {}
for env, spec in data.items():
    seed = ResourcesSeedSessionRequest.model_validate(spec["seed"])
    try:
        check_resources_session_contract(relay(spec["url"], spec["key"]), seed, keeps_state=True)
        results[env] = "passed"
    except AssertionError as exc:
        results[env] = f"failed: {exc}"
print(json.dumps(results))
"""


def _seed(env: str) -> dict[str, Any]:
    row = ({k: v for k, v in examples(env)[0].items() if k != "agent_ref"}
           if (ROOT / "datasets" / env / "example.jsonl").exists()
           else {"responses_create_params": {"input": [{"role": "user", "content": "q"}]}})
    # NeMo-Gym 0.7.0's EpisodeId and TaskId (nemo_gym/episode_types.py), validated by its own models
    return {"resources_session_id": f"rs-{env}", "episode_id": {"rollout_id": f"rollout-{env}", "attempt": 0},
            "task_id": {"taskset": f"{env}:example", "task_id": "0"}, "task_data": row}


def test_nemo_gyms_own_session_contract_passes_on_every_running_environment(nemo, tmp_path):
    with running_environments("nemo-session") as servers:
        data = {env: {"url": server.url, "key": server.headers().get("Authorization", "").removeprefix("Bearer "),
                      "seed": _seed(env)} for env, server in servers.items()}
        results = nemo.python_json(NEMO_CONTRACT, data, tmp_path)
    assert set(results) == set(ENVIRONMENTS)
    failed = {env: outcome for env, outcome in results.items() if outcome != "passed"}
    assert not failed, failed
