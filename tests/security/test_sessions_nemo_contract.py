"""NeMo-Gym's session protocol works beside ours on every environment.

`check_resources_session_contract` below is a faithful port of NeMo-Gym 0.7.0's
`nemo_gym.testing.session_conformance.check_resources_session_contract` (same steps, same assertions, same
in-process TestClient through the app's real routes and middleware). Only its pydantic request and reply
models are replaced by the plain dicts they validate to (`extra="forbid"`: exactly these keys), because
nemo-gym 0.7.0 needs Python 3.13.
"""
from __future__ import annotations

import contextlib

from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from services.core.loader import available_kinds, load_server
from tests.contract.test_openapi_schemas import REQUIRED  # options a kind needs to be built (nothing is contacted)

ENVIRONMENTS = [kind for kind in available_kinds() if kind.startswith("resources/")]


# NeMo-Gym 0.7.0's EpisodeId and TaskId shapes (nemo_gym/episode_types.py; checked by its own models in
# tests/compat/test_session_contract.py)
EPISODE = {"rollout_id": "rollout-1", "attempt": 0}
TASK = {"taskset": "contract:example", "task_id": "1"}


def _seed_reply(body: Any) -> dict[str, Any]:
    """ResourcesSeedSessionResponse.model_validate: resources_session_id (str), two optional fields, no others."""
    assert isinstance(body, dict) and set(body) <= {"resources_session_id", "resources_tools", "sandbox_access"}, body
    assert isinstance(body.get("resources_session_id"), str), body
    return body


def _close_reply(body: Any) -> dict[str, Any]:
    """ResourcesCloseSessionResponse.model_validate: exactly resources_session_id (str)."""
    assert isinstance(body, dict) and set(body) == {"resources_session_id"}, body
    assert isinstance(body["resources_session_id"], str), body
    return body


def check_resources_session_contract(app: FastAPI, seed: dict[str, Any], *, keeps_state: bool) -> None:
    """Seed, re-seed, and close a session through `app`; AssertionError on a contract violation (NeMo-Gym 0.7.0)."""
    client = TestClient(app, raise_server_exceptions=False)
    seed_body = dict(seed)
    close_body = {"resources_session_id": seed["resources_session_id"], "episode_id": seed["episode_id"]}

    for attempt in ("seed", "repeated seed"):
        response = client.post("/seed_session", json=seed_body)
        assert response.status_code == 200, f"{attempt} failed: {response.status_code} {response.text}"
        seeded = _seed_reply(response.json())
        assert seeded["resources_session_id"] == seed["resources_session_id"], f"{attempt} returned another session"

    for attempt in ("close", "repeated close"):
        response = client.post("/close_session", json=close_body)
        assert response.status_code == 200, f"{attempt} failed: {response.status_code} {response.text}"
        closed = _close_reply(response.json())
        assert closed["resources_session_id"] == seed["resources_session_id"], f"{attempt} named another session"

    never_seeded = {**seed, "resources_session_id": f"{seed['resources_session_id']}-never-seeded"}
    response = client.post(
        "/close_session",
        json={"resources_session_id": never_seeded["resources_session_id"], "episode_id": seed["episode_id"]},
    )
    assert response.status_code == 200, f"close of a never-seeded session failed: {response.status_code}"

    if keeps_state:
        for late_seed in (seed, never_seeded):
            response = client.post("/seed_session", json=late_seed)
            assert response.status_code >= 400, (
                f"seed after close recreated {late_seed['resources_session_id']}: {response.status_code}"
            )


def _example_row(kind: str) -> dict[str, Any]:
    from tests.contract.servers import ROOT, examples

    env = kind.split("/", 1)[1]
    if not (ROOT / "datasets" / env / "example.jsonl").exists():
        return {"responses_create_params": {"input": [{"role": "user", "content": "q"}]}}
    return {k: v for k, v in examples(env)[0].items() if k != "agent_ref"}


SANDBOXED: dict[str, dict[str, Any]] = {"resources/terminal": {"warm_pool": 0}, "resources/swe": {"warm_pool": 0}}


@pytest.mark.parametrize("kind", ENVIRONMENTS)
def test_nemo_gym_session_contract(kind):
    module = load_server(kind)
    app = module.build(module.Config(name="nemo-contract", **REQUIRED.get(kind, {}), **SANDBOXED.get(kind, {})))
    seed = {"resources_session_id": f"rs-{kind.replace('/', '-')}", "episode_id": {"rollout_id": "rollout-1", "attempt": 0},
            "task_id": {"taskset": "contract:example", "task_id": "1"}, "task_data": _example_row(kind)}
    # workspace environments find their sandbox at start-up: run the app's lifespan around the contract
    with TestClient(app) if kind in SANDBOXED else contextlib.nullcontext():
        check_resources_session_contract(app, seed, keeps_state=True)
    assert not app.state.env.sessions  # closed sessions release their state


def test_workplace_named_session_is_usable_with_its_cookie():
    """After a named seed the caller's cookie carries the server-issued id: tools see the seeded state."""
    module = load_server("resources/workplace")
    app = module.build(module.Config(name="nemo-tools"))
    client = TestClient(app, raise_server_exceptions=False)
    seed = {"resources_session_id": "rs-tools", "episode_id": EPISODE, "task_id": TASK,
            "task_data": _example_row("resources/workplace")}
    seeded = client.post("/seed_session", json=seed)
    assert seeded.status_code == 200 and seeded.json() == {"resources_session_id": "rs-tools"}
    assert seeded.headers["x-session-id"] != "rs-tools"  # the id that grants access is the server's own
    assert client.post("/list_projects", json={}).status_code == 200  # cookie only, no header
    stranger = TestClient(app, raise_server_exceptions=False)
    assert stranger.post("/list_projects", json={}).status_code == 400  # no session: not the owner's


def test_a_failed_named_seed_can_be_retried():
    """A seed the environment rejects (a bad row: 400) opens nothing, so the caller may retry that name."""
    module = load_server("resources/workplace")
    app = module.build(module.Config(name="nemo-retry"))
    client = TestClient(app, raise_server_exceptions=False)
    row = _example_row("resources/workplace")
    seed = {"resources_session_id": "rs-retry", "episode_id": EPISODE, "task_id": TASK,
            "task_data": {**row, "initial_state": {"invoices": []}}}
    assert client.post("/seed_session", json=seed).status_code == 400
    assert not app.state.env.sessions
    assert client.post("/seed_session", json={**seed, "task_data": row}).status_code == 200
