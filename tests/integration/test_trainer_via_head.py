"""The trainer outside the servers' network: an agent whose registered URL does not resolve from
the trainer's machine (a compose service name such as `http://math_simple_agent:8000`) is called
through the head's proxy, with no flag; a reachable one is called directly. Real head, resource,
stub model and agent on 127.0.0.1; the unreachable agent is a registration under a `.invalid` name
(a name that never resolves), so the reply can only have come from the head's proxy."""
from __future__ import annotations

import httpx
import pytest

from tests.integration._trainer_stack import small_stack
from trainer.client import RolloutClient

AGENT = "exact_match_simple_agent"
OUTSIDE = "outside_agent"
UNREACHABLE = "http://gymserve-private-net.invalid:8000"


def _row(agent: str) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": "Capital of France?"}]},
            "expected_answer": "Paris", "agent_ref": {"type": "responses_api_agents", "name": agent}}


@pytest.fixture(scope="module")
def stack():
    agent_opts = ["resources_server=exact_match", "model_server=policy", "rollout_deadline_s=60"]
    with small_stack([("resources/exact_match", "exact_match", []),
                      ("models/stub", "policy", ["text=Paris"]),
                      ("agents/simple_agent", AGENT, agent_opts)],
                     # the name stands for the stack's own network (compose service names): allowed
                     head_env={"GYMSERVE_ALLOWED_HOSTS": "gymserve-private-net.invalid"}) as (head, procs):
        body = {"name": OUTSIDE, "server_type": "responses_api_agents", "kind": "agents/simple_agent",
                "host": "gymserve-private-net.invalid", "port": 8000, "url": UNREACHABLE, "ttl_s": 600}
        assert httpx.post(f"{head.url}/register", json=body, timeout=10).status_code == 200
        yield head, procs


async def test_reachable_agent_is_called_directly(stack):
    head, procs = stack
    async with RolloutClient(head.url, concurrency=2, deadline_s=60) as client:
        records = await client.run_many([_row(AGENT), _row(AGENT)])
        assert [r["reward"] for r in records] == [1.0, 1.0], records
        assert await client.resolve(AGENT) == procs[AGENT].url  # no detour through the head


async def test_unreachable_agent_goes_through_the_head_proxy(stack):
    head, _ = stack
    async with RolloutClient(head.url, concurrency=2, deadline_s=60, retries=0) as client:
        assert await client.resolve(OUTSIDE) == f"{head.url}/servers/{OUTSIDE}"
        record = await client.run(_row(OUTSIDE))
    # the head tried the in-network URL itself: its proxy's verdict, masked, never a reward 0
    assert record["mask_sample"] is True and record["reward"] is None, record
    assert record["failure_kind"] == "upstream", record
    assert f"cannot reach server '{OUTSIDE}'" in record["failure_reason"], record


async def test_head_proxy_route_carries_a_whole_rollout(stack):
    """The proxy route itself delivers a scored rollout (what a trainer outside the network gets)."""
    head, _ = stack
    async with RolloutClient(head.url, agents={AGENT: f"{head.url}/servers/{AGENT}"}, deadline_s=60) as client:
        record = await client.run(_row(AGENT))
    assert record["reward"] == 1.0 and not record.get("mask_sample"), record
