"""The OpenEnv and MCP bindings of resource servers, one shared stack.

OpenEnv, checked with OpenEnv's own pieces (`openenv` 0.10.0 in a virtualenv of its own):
`openenv validate` passes on every environment of the default stack, and `GenericEnvClient` episodes
(`reset(row=...)`, tool steps, the final `text` step) score exactly as `/verify` does on the same
rollouts (a differential test), masked judge failures included; the head lists `openenv_url` and
`mcp_url`; without the bearer key neither the WebSocket nor the validator gets in.

MCP, with the real `mcp` 2.3.0 client (its own virtualenv): workplace, code and terminal sessions seeded
over HTTP are driven through `/mcp` (tools listed and called, one MCP session per gymserve session),
then `/verify` on that session gives the reward the tool calls earned."""
from __future__ import annotations

import json
import secrets
from pathlib import Path

import httpx
import pytest

from gymserve.testing import ServerProcess
from services.core.bindings.episode import response_object
from tests.integration._trainer_stack import small_stack
from tests.integration.protocol_clients import MCP, OPENENV, client_venv, last_json, run_script

ROOT = Path(__file__).resolve().parents[2]
# every resource server of the default stack (gymserve/stacks/default.yaml)
DEFAULT_ENVS = ["exact_match", "math", "math_multi_reward", "code_jaccard", "mcqa", "instruction_following",
                "reasoning_gym", "code", "workplace", "equivalence_llm_judge", "reward_model"]
JUDGE_RULES = [{"match": "CONFLICT", "text": "Either [[A=B]] or [[A!=B]], hard to say."},
               {"match": "Lamarck", "text": "[[A!=B]]"}, {"match": ".", "text": "[[A=B]]"}]
SUM_PROGRAM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"

VALIDATE = r"""
import json, os, sys
import requests
key = os.environ["GYMSERVE_TEST_KEY"]
_request = requests.Session.request
def request(self, method, url, *args, **kwargs):  # openenv validate has no option for headers
    headers = dict(kwargs.pop("headers", None) or {})
    if key:
        headers["Authorization"] = "Bearer " + key
    return _request(self, method, url, *args, headers=headers, **kwargs)
requests.Session.request = request
import typer
from openenv.cli.commands.validate import validate
out = {}
for url in json.load(sys.stdin):
    try:
        validate(url, json_output=True, url=None, level="semantic", skip_build=False, local=False,
                 policy_version=None, output=None, timeout=30.0)
        out[url] = 0
    except typer.Exit as exc:
        out[url] = exc.exit_code
print(json.dumps(out))
"""

EPISODES = r"""
import asyncio, json, os, sys
from openenv.core.generic_client import GenericEnvClient
plan = json.load(sys.stdin)
headers = {"Authorization": "Bearer " + os.environ["GYMSERVE_TEST_KEY"]}
async def episode(item):
    steps = []
    async with GenericEnvClient(base_url=item["url"], headers=headers, message_timeout_s=120) as env:
        result = await env.reset(row=item["row"])
        steps.append({"observation": result.observation, "reward": result.reward, "done": result.done})
        for action in item["actions"]:
            result = await env.step(action)
            steps.append({"observation": result.observation, "reward": result.reward, "done": result.done})
        state = await env.state()
    return {"steps": steps, "state": state}
async def main():
    return await asyncio.gather(*(episode(item) for item in plan))
print(json.dumps(asyncio.run(main())))
"""


def _rows(env: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / "datasets" / env / "example.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def key():
    with pytest.MonkeyPatch.context() as mp:
        value = secrets.token_urlsafe(16)
        mp.setenv("GYMSERVE_API_KEY", value)
        yield value


@pytest.fixture(scope="module")
def openenv_venv():
    return client_venv(*OPENENV)


@pytest.fixture(scope="module")
def stack(key):
    with ServerProcess("models/stub", name="judge_stub", env={"GYMSERVE_SERVER_SPEC": json.dumps({"rules": JUDGE_RULES})}
                       ) as judge:
        options = {"equivalence_llm_judge": [f"judge_model_server={judge.url}"],
                   "reward_model": ["model_name=tiny", "device=cpu"]}
        servers = [("resources/terminal", "terminal", []),
                   *[(f"resources/{name}", name, options.get(name, ["workers=1"])) for name in DEFAULT_ENVS]]
        with small_stack(servers, ready_timeout_s=300) as (head, procs):
            yield head, procs


def _auth(key: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **extra}


def _plans() -> list[tuple[str, dict, list[dict]]]:
    """(environment, row, actions) episodes: right and wrong answers, tool calls where there are tools."""
    plans: list[tuple[str, dict, list[dict]]] = []
    for env in DEFAULT_ENVS:
        rows = _rows(env)[:2]
        for row in rows:
            answer = str(row.get("expected_answer") or "")
            if env == "code":
                continue
            if env == "equivalence_llm_judge":
                texts = [answer, "Lamarck", "CONFLICT"]
            else:
                texts = [f"<think>sure</think>\n<answer>{answer}</answer>\nAnswer: {answer}\n\\boxed{{{answer}}}",
                         "I do not know."]
            plans += [(env, row, [{"text": text}]) for text in texts]
    code_row = next(r for r in _rows("code") if r["id"] == "sum_two")
    plans.append(("code", code_row, [{"tool": "execute_python", "arguments": {"code": "print(40 + 2)"}},
                                     {"text": SUM_PROGRAM}]))
    plans.append(("code", code_row, [{"text": "print('no')"}]))
    for row in _rows("workplace")[:2]:
        calls = [{"tool": c["name"], "arguments": json.loads(c["arguments"])} for c in row["ground_truth"]]
        plans.append(("workplace", row, [*calls, {"text": "Done."}]))
        plans.append(("workplace", row, [{"text": "Done."}]))
    return plans


def _verify_over_http(url: str, key: str, row: dict, actions: list[dict]) -> dict:
    """The same rollout through gymserve's own HTTP API: seed, tool calls, `/verify` on the session."""
    with httpx.Client(base_url=url, headers=_auth(key), timeout=120) as http:
        sid = http.post("/seed_session", json=row).json()["session_id"]
        items: list[dict] = []
        for action in actions[:-1]:
            call_id = f"call_{len(items)}"
            items.append({"type": "function_call", "call_id": call_id, "name": action["tool"], "status": "completed",
                          "arguments": json.dumps(action["arguments"])})
            reply = http.post(f"/{action['tool']}", json=action["arguments"], headers={"X-Session-Id": sid})
            assert reply.status_code == 200, reply.text
            items.append({"type": "function_call_output", "call_id": call_id, "output": reply.text})
        body = {**row, "response": response_object(items, actions[-1]["text"])}
        reply = http.post("/verify", json=body, headers={"X-Session-Id": sid, "X-Close-Session": "1"})
        assert reply.status_code == 200, reply.text
        return reply.json()


def test_head_lists_binding_urls(stack, key):
    head, procs = stack
    rows = {r["name"]: r for r in httpx.get(f"{head.url}/server_instances", headers=_auth(key)).json()}
    for env in DEFAULT_ENVS:
        assert rows[env]["openenv_url"] == f"{procs[env].url}/openenv"
        assert rows[env]["mcp_url"] == f"{procs[env].url}/mcp"


def test_openenv_validate_passes_on_every_environment(stack, key, openenv_venv):
    _, procs = stack
    urls = [f"{procs[env].url}/openenv" for env in DEFAULT_ENVS]
    codes = last_json(run_script(openenv_venv, VALIDATE, urls, env={"GYMSERVE_TEST_KEY": key}))
    assert codes == {url: 0 for url in urls}
    # without the key OpenEnv's validator gets 401s (only the binding's health probe is open)
    refused = last_json(run_script(openenv_venv, VALIDATE, urls[:1], env={"GYMSERVE_TEST_KEY": ""}))
    assert refused == {urls[0]: 1}


def test_generic_env_client_episodes_score_as_verify(stack, key, openenv_venv):
    _, procs = stack
    plans = _plans()
    payload = [{"url": f"{procs[env].url}/openenv", "row": row, "actions": actions} for env, row, actions in plans]
    episodes = last_json(run_script(openenv_venv, EPISODES, payload, env={"GYMSERVE_TEST_KEY": key}, timeout_s=600))
    seen = {"scored": 0, "masked": 0, "rewards": set()}
    paths = {env: httpx.get(f"{procs[env].url}/openapi.json", headers=_auth(key)).json()["paths"] for env in DEFAULT_ENVS}
    for (env, row, actions), episode in zip(plans, episodes):
        steps = episode["steps"]
        first, last = steps[0], steps[-1]
        assert first["done"] is False and first["reward"] is None
        tools = {t["name"] for t in first["observation"]["tools"]}
        assert {f"/{name}" for name in tools} <= set(paths[env]) and (bool(tools) == (env in ("code", "workplace")))
        for step, action in zip(steps[1:-1], actions[:-1]):
            assert step["done"] is False and step["observation"]["tool"] == action["tool"]
            assert step["observation"]["error"] is None
        assert last["done"] is True and episode["state"]["done"] is True
        verified = _verify_over_http(procs[env].url, key, row, actions)
        metadata = last["observation"]["metadata"]
        if verified.get("mask_sample"):
            assert last["reward"] is None, (env, actions)  # never a fabricated 0
            assert metadata["mask_sample"] is True and metadata["failure_kind"] == verified["failure_kind"]
            seen["masked"] += 1
        else:
            # the reward model scores in batches: which requests share a batch moves the last float bits
            expected = pytest.approx(verified["reward"], abs=1e-5) if env == "reward_model" else verified["reward"]
            assert last["reward"] == expected, (env, actions, metadata, verified)
            assert metadata.get("reward_components") == verified.get("reward_components")
            seen["scored"] += 1
            seen["rewards"].add(verified["reward"])
    assert seen["masked"] >= 1 and seen["scored"] >= 20 and {0.0, 1.0} <= seen["rewards"]


MCP_SESSIONS = r"""
import asyncio, json, os, sys
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
plan = json.load(sys.stdin)
key = os.environ["GYMSERVE_TEST_KEY"]
async def one(item):
    headers = {"Authorization": "Bearer " + key, "X-Session-Id": item["session"]}
    async with httpx2.AsyncClient(headers=headers, timeout=120) as http:
        transport = streamable_http_client(item["url"], http_client=http, terminate_on_close=False)
        async with Client(transport) as client:
            tools = await client.list_tools()
            calls = []
            for call in item["calls"]:
                result = await client.call_tool(call["name"], call["arguments"])
                calls.append({"is_error": bool(result.is_error), "text": result.content[0].text})
    return {"tools": [t.name for t in tools.tools], "calls": calls}
async def main():
    return await asyncio.gather(*(one(item) for item in plan))
print(json.dumps(asyncio.run(main())))
"""


@pytest.fixture(scope="module")
def mcp_venv():
    return client_venv(*MCP)


def test_mcp_client_drives_sessions_to_a_verified_reward(stack, key, mcp_venv):
    _, procs = stack
    workplace = _rows("workplace")[0]
    code = next(r for r in _rows("code") if r["id"] == "sum_two")
    terminal = next(r for r in _rows("terminal") if r["task_id"] == "hello_file")
    plans = [("workplace", workplace, [{"name": c["name"], "arguments": json.loads(c["arguments"])}
                                       for c in workplace["ground_truth"]], "Done."),
             ("code", code, [{"name": "execute_python", "arguments": {"code": "print(40 + 2)"}}], SUM_PROGRAM),
             ("terminal", terminal, [{"name": "bash", "arguments": {"command": "echo hi > hello.txt"}}], "Created."),
             ("workplace", workplace, [{"name": "send_email", "arguments": {"recipient": "nobody", "subject": "s",
                                                                             "body": "b"}}], "Done.")]
    sessions = []
    for env, row, _, _ in plans:
        reply = httpx.post(f"{procs[env].url}/seed_session", json=row, headers=_auth(key), timeout=60)
        sessions.append(reply.json()["session_id"])
    payload = [{"url": f"{procs[env].url}/mcp", "session": sid, "calls": calls}
               for (env, _, calls, _), sid in zip(plans, sessions)]
    results = last_json(run_script(mcp_venv, MCP_SESSIONS, payload, env={"GYMSERVE_TEST_KEY": key}))
    rewards = []
    for (env, row, calls, text), sid, result in zip(plans, sessions, results):
        listed = httpx.get(f"{procs[env].url}/openapi.json", headers=_auth(key)).json()["paths"]
        assert result["tools"] and {f"/{t}" for t in result["tools"]} <= set(listed)
        items = []
        for i, (call, out) in enumerate(zip(calls, result["calls"])):
            items += [{"type": "function_call", "call_id": f"c{i}", "name": call["name"], "status": "completed",
                       "arguments": json.dumps(call["arguments"])},
                      {"type": "function_call_output", "call_id": f"c{i}", "output": out["text"]}]
        verified = httpx.post(f"{procs[env].url}/verify", json={**row, "response": response_object(items, text)},
                              headers=_auth(key, **{"X-Session-Id": sid, "X-Close-Session": "1"}), timeout=120).json()
        rewards.append(verified["reward"])
        if env == "code":
            assert '"stdout":"42\\n"' in result["calls"][0]["text"]
    assert results[3]["calls"][0]["is_error"] is True  # a refused call is a tool error the model sees
    assert rewards == [1.0, 1.0, 1.0, 0.0]  # the session's state (the sent email, the file) earned it


def test_mcp_endpoint_needs_the_key_and_a_session(stack, key):
    _, procs = stack
    url = f"{procs['workplace'].url}/mcp"
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "send_email", "arguments": {}}}
    assert httpx.post(url, json=call).status_code == 401
    assert httpx.post(url, json=call, headers=_auth(key)).status_code == 400  # no Mcp-Session-Id
    assert httpx.post(url, json=call, headers=_auth(key, **{"Mcp-Session-Id": "nope"})).status_code == 404
    assert httpx.post(url, content=b"{", headers=_auth(key)).json()["error"]["code"] == -32700
