"""NeMo-Gym 0.7.0's own clients against our head, unchanged: `ng_collect_rollouts` (the same code as
`gym eval run --no-serve`) collects with the right rewards and aggregate metrics, and
`gym env status` lists every server as healthy.

NeMo-Gym's clients send no API key, so the stack runs with the loopback-only opt-out
(`GYMSERVE_NO_AUTH=1`, what `gymserve up --no-auth` sets) on 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.compat.nemo_gym import MATH_ROWS
from tests.integration.up_helpers import Up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first compat test may install NeMo-Gym

STACK = Path(__file__).parent / "stacks" / "nemo_collect.yaml"


@pytest.fixture(scope="module")
def head():
    launcher = Up("-c", str(STACK), env={"GYMSERVE_NO_AUTH": "1"})
    try:
        launcher.wait_for(r"all 4 servers ready", timeout_s=180)
        url = launcher.wait_for(r"head on (http://\S+)").group(1)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        yield {"url": url, "arg": f"+head_server={{host:{host},port:{port}}}"}
    finally:
        launcher.kill()


def test_config_has_an_environment_server_per_agent(head):
    config = yaml.safe_load(httpx.get(f"{head['url']}/global_config_dict_yaml", timeout=10).json())
    agent = config["math_simple_agent"]["responses_api_agents"]["simple_agent"]
    assert agent["resources_server"] == {"type": "resources_servers", "name": "math"}
    assert agent["model_server"] == {"type": "responses_api_models", "name": "policy_model"}
    relay = config["math_environment_server"]["environment_servers"]["legacy_agent"]
    assert relay["agent_server"] == {"type": "responses_api_agents", "name": "math_simple_agent"}
    assert (relay["host"], relay["port"]) == (agent["host"], agent["port"])


def test_ng_collect_rollouts_collects_from_our_head(nemo, head, workdir):
    (workdir / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MATH_ROWS))
    done = nemo.run("ng_collect_rollouts", head["arg"], "+agent_name=math_simple_agent",
                    "+input_jsonl_fpath=rows.jsonl", "+output_jsonl_fpath=rollouts.jsonl", "+num_repeats=2",
                    cwd=workdir)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rollouts = [json.loads(line) for line in (workdir / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 4
    for r in rollouts:
        assert r["agent_ref"]["name"] == "math_simple_agent"
        assert r["reward"] == (1.0 if r["expected_answer"] == "4" else 0.0), r
        assert r["mask_sample"] is False and r["_ng_environment_server"] == "math_environment_server"
    assert (workdir / "rollouts_failures.jsonl").read_text().strip() == ""
    [entry] = json.loads((workdir / "rollouts_aggregate_metrics.json").read_text())
    assert entry["agent_ref"]["name"] == "math_simple_agent"
    assert entry["key_metrics"]["mean/reward"] == pytest.approx(0.5)
    assert entry["agent_metrics"]["num_repeats"] == 2
    assert {g["_ng_task_index"]: g["mean/reward"] for g in entry["group_level_metrics"]} == {0: 1.0, 1: 0.0}


def test_gym_env_status_lists_our_servers(nemo, head, workdir):
    done = nemo.run("gym", "env", "status", head["arg"], cwd=workdir, timeout_s=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    for name in ("policy_model", "math", "math_simple_agent"):
        assert f"✓ {name} (" in done.stdout, done.stdout[-4000:]
    assert "3 servers found (3 healthy, 0 unhealthy)" in done.stdout


NEMO_VALIDATE = """
from nemo_gym.base_resources_server import BaseVerifyRequest
from nemo_gym.openai_utils import NeMoGymResponse
NeMoGymResponse.model_validate(data["model_reply"])
BaseVerifyRequest.model_validate(data["verify_body"])
print(json.dumps("ok"))
"""


def test_model_replies_and_verify_bodies_are_complete_for_nemo_gym(nemo, head, workdir):
    """NeMo-Gym's agents validate every model reply, and its resources servers every `/verify` body
    (a missing `parallel_tool_calls`, `tool_choice`, `tools` or usage detail is a 422 there)."""
    rows = {r["name"]: r for r in httpx.get(f"{head['url']}/server_instances", timeout=10).json()}
    params = {"input": [{"role": "user", "content": "2+2?"}], "tools": [], "temperature": 0.5}
    model_reply = httpx.post(f"{rows['policy_model']['url']}/v1/responses", json=params, timeout=30).json()
    row = {**MATH_ROWS[0], "responses_create_params": {**MATH_ROWS[0]["responses_create_params"], "temperature": 0.5}}
    rollout = httpx.post(f"{rows['math_simple_agent']['url']}/run", json=row, timeout=60).json()
    assert rollout["reward"] == 1.0
    verify_body = {**row, "response": rollout["response"]}
    assert rollout["response"]["temperature"] == 0.5 and rollout["response"]["parallel_tool_calls"] is True
    data = {"model_reply": model_reply, "verify_body": verify_body}
    assert nemo.python_json(NEMO_VALIDATE, data, workdir) == "ok"


def test_gymserve_collect_routes_nemo_gym_rows_with_agent(head, workdir):
    """NeMo-Gym rows carry no agent_ref: `gymserve collect --agent NAME` routes them, as `+agent_name`."""
    rows = workdir / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in MATH_ROWS))
    out = workdir / "rollouts.jsonl"
    done = subprocess.run([sys.executable, "-m", "gymserve", "collect", "-i", str(rows), "-o", str(out),
                           "--head", head["url"], "--agent", "math_simple_agent", "--no-progress"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "GYMSERVE_NO_AUTH": "1"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["expected_answer"], r["reward"]) for r in records) == [("4", 1.0), ("7", 0.0)]
    assert all(r["agent_ref"]["name"] == "math_simple_agent" for r in records)


def test_gymserve_collect_routes_rows_by_task_source(head, workdir):
    """NeMo-Gym 0.7.0's flat rows name their dataset's instance in `task_source`: a resources server
    routes to the one agent that uses it, resolved from the head's config as NeMo-Gym resolves it."""
    rows = workdir / "rows.jsonl"
    rows.write_text("".join(json.dumps({**r, "task_source": "math"}) + "\n" for r in MATH_ROWS))
    out = workdir / "rollouts.jsonl"
    done = subprocess.run([sys.executable, "-m", "gymserve", "collect", "-i", str(rows), "-o", str(out),
                           "--head", head["url"], "--no-progress"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "GYMSERVE_NO_AUTH": "1"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["expected_answer"], r["reward"]) for r in records) == [("4", 1.0), ("7", 0.0)]
    assert all(r["agent_ref"]["name"] == "math_simple_agent" for r in records)
    rows.write_text(json.dumps({**MATH_ROWS[0], "task_source": "no_such_env"}) + "\n")
    done = subprocess.run([sys.executable, "-m", "gymserve", "collect", "-i", str(rows), "-o", str(out),
                           "--head", head["url"], "--no-progress"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "GYMSERVE_NO_AUTH": "1"})
    assert done.returncode == 2 and "task_source 'no_such_env'" in done.stderr, done.stderr[-2000:]


NEMO_HEAD = """
import json, os, time
from nemo_gym.server_utils import HeadServer, ServerInstanceDisplayConfig
_, _, head = HeadServer.run_webserver()
rows = json.loads(os.environ["GYMSERVE_TEST_INSTANCES"])
head.set_server_instances([ServerInstanceDisplayConfig(**r).model_dump(mode="json") for r in rows])
head.mark_ready()
print("ready", flush=True)
while True:
    time.sleep(3600)
"""


@pytest.fixture(scope="module")
def nemo_head(nemo, head):
    """NeMo-Gym 0.7.0's own head server (its `HeadServer`, as `gym env start` runs it) listing our
    stack's servers with the rows `gym env start` writes: `name` is the implementation
    (`simple_agent`), `config_path` and `process_name` the instance (`math_simple_agent`)."""
    from services.core.ports import free_port

    config = yaml.safe_load(httpx.get(f"{head['url']}/global_config_dict_yaml", timeout=10).json())
    port = free_port()
    config["head_server"] = {"host": "127.0.0.1", "port": port}
    rows = []
    for row in httpx.get(f"{head['url']}/server_instances", timeout=10).json():
        if row["name"] in config and row.get("server_type") != "head_server":
            [impl] = config[row["name"]][row["server_type"]]
            rows.append({"process_name": row["name"], "config_path": row["name"], "name": impl,
                         "server_type": row["server_type"], "host": row["host"], "port": row["port"],
                         "url": row["url"], "pid": row["pid"]})
    env = {**nemo.env, "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config), "GYMSERVE_TEST_INSTANCES": json.dumps(rows)}
    proc = subprocess.Popen([str(nemo.venv / "bin" / "python"), "-c", NEMO_HEAD], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert proc.stdout is not None and "ready" in proc.stdout.readline()
        yield {"url": f"http://127.0.0.1:{port}", "rows": rows}
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_gymserve_collect_and_status_against_a_nemo_gym_head(nemo_head, workdir):
    assert {r["name"] for r in nemo_head["rows"]} >= {"simple_agent", "math"}  # names are not instance names
    rows = workdir / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in MATH_ROWS))
    out = workdir / "rollouts.jsonl"
    env = {**os.environ, "GYMSERVE_NO_AUTH": "1"}
    done = subprocess.run([sys.executable, "-m", "gymserve", "collect", "-i", str(rows), "-o", str(out),
                           "--head", nemo_head["url"], "--agent", "math_simple_agent", "--no-progress"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["expected_answer"], r["reward"]) for r in records) == [("4", 1.0), ("7", 0.0)]
    done = subprocess.run([sys.executable, "-m", "gymserve", "status", "--head", nemo_head["url"], "--json"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    report = json.loads(done.stdout)
    assert {s["name"]: s["health"] for s in report["servers"]} == {
        "policy_model": "ready", "math": "ready", "math_simple_agent": "ready"}


def test_gymserve_prepare_reports_a_row_our_agent_rejects(head, workdir):
    """`gymserve prepare --env math` checks rows with the model our agents parse `/run` with: the row
    the agent answers 4xx for is reported invalid there, naming the same field."""
    bad = {"responses_create_params": {"input": "2+2?", "temperature": "hot"}, "expected_answer": "4"}
    agents = {r["name"]: r["url"] for r in httpx.get(f"{head['url']}/server_instances", timeout=10).json()}
    rejected = httpx.post(f"{agents['math_simple_agent']}/run", json=bad, timeout=30)
    assert 400 <= rejected.status_code < 500 and "responses_create_params.temperature" in rejected.text
    rows = workdir / "rows.jsonl"
    rows.write_text(json.dumps(bad) + "\n" + json.dumps(MATH_ROWS[0]) + "\n")
    done = subprocess.run([sys.executable, "-m", "gymserve", "prepare", "-i", str(rows), "-o", str(workdir / "out"),
                           "--agent", "math_simple_agent", "--env", "math"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and f"{rows}:1: responses_create_params.temperature" in done.stdout + done.stderr
    assert f"{rows}:2" not in done.stdout + done.stderr
