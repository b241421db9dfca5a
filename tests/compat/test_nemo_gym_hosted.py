"""NeMo-Gym 0.7.0's own resources servers hosted by gymserve (`kind: nemo_gym/<server>`), unchanged.

A representative subset runs in `make test` (the whole catalogue: `make catalogue`): a server with no
requirements of its own (equivalence_rule), one with a requirement layered on the base virtualenv
(mcqa: tiktoken) and one with several (structeval). For each, its example rows, played by the
scripted policy of its recorded rollouts, get the same rewards through gymserve (`gymserve collect`,
our head, our key, the sidecar) as through NeMo-Gym's own simple_agent straight against the same
server process. The sidecar is the only way in: no key, no answer; NeMo-Gym's server binds loopback.
Killing NeMo-Gym's server mid-collect: every row comes back, as a right reward or a masked failure,
and the server is restarted.
"""
from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from gymserve.nemo_gym.wheel import package_root, server_files
from tests.compat.nemo_gym import text_response
from tests.compat.nemo_hosted import NeMoSide, collect_through_gymserve, replay_rows, stack_yaml
from tests.integration.up_helpers import Up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]  # the first run builds NeMo-Gym's virtualenvs

SUBSET = ["equivalence_rule", "mcqa", "structeval"]


@pytest.fixture(scope="module")
def stack(nemo, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("nemo-hosted")
    (workdir / "stack.yaml").write_text(stack_yaml(SUBSET))
    launcher = Up("-c", str(workdir / "stack.yaml"))
    try:
        launcher.wait_for(rf"all {2 * len(SUBSET) + 2} servers ready", timeout_s=3000)
        head = launcher.wait_for(r"head on (http://\S+)").group(1)
        env = {**launcher.env}
        yield {"up": launcher, "head": head, "env": env, "workdir": workdir}
    finally:
        if launcher.proc.poll() is None:
            os.killpg(launcher.proc.pid, signal.SIGTERM)
            try:
                launcher.wait(60)
            except Exception:
                launcher.kill()
        launcher.kill()


def ready(stack, name: str) -> dict:
    reply = httpx.get(f"{stack['head']}/servers/{name}/ready", headers=stack["up"].auth, timeout=10)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.fixture(scope="module")
def nemo_side(nemo, stack):
    side = NeMoSide(nemo.venv, stack["workdir"])
    side.start_stub()
    yield side
    side.close()


@pytest.mark.parametrize("server", SUBSET)
def test_example_rows_agree_with_nemo_gyms_own_agent(server, stack, nemo_side, nemo):
    files = server_files(package_root(nemo.venv), server)
    rows, why_not = replay_rows(files)
    assert why_not is None and rows, why_not
    ours, failures = collect_through_gymserve(stack["head"], f"nemo_{server}_agent", rows, stack["workdir"],
                                              stack["env"])
    assert failures == [] and len(ours) == len(rows), (failures, ours)
    assert all(r["mask_sample"] is False for r in ours), ours
    raw = ready(stack, f"nemo_{server}")["upstream"]
    agent = nemo_side.start_agent(files.instance, files.impl, raw)
    try:
        theirs = nemo_side.run_rows(agent, rows)
    finally:
        nemo_side.stop_agent()
    assert all("reward" in r for r in theirs), theirs
    # the scripted policy really answered: what NeMo-Gym's agent got is the recorded final message
    for row, rollout in zip(rows, ours):
        script = json.loads(row["responses_create_params"]["metadata"]["stub_script"])
        texts = [c["text"] for item in rollout["response"]["output"] if item["type"] == "message"
                 for c in item["content"]]
        assert texts[-1] == script[0]["text"]
    assert [r["reward"] for r in ours] == [r["reward"] for r in theirs]
    recorded = [r.get("reward") for r in files.example_rollouts()]
    assert any(r is not None for r in recorded)


def test_only_through_gymserve_with_the_key(stack):
    info = ready(stack, "nemo_mcqa")
    assert info["upstream"].startswith("http://127.0.0.1:") and info["nemo_gym_server"] == "mcqa"
    body = {"responses_create_params": {"input": [{"role": "user", "content": "A or B?"}]},
            "response": text_response("\\boxed{B}"), "options": [{"A": "x"}, {"B": "y"}], "expected_answer": "B",
            "grading_mode": "strict_single_letter_boxed"}
    url = f"{stack['head']}/servers/nemo_mcqa/verify"
    assert httpx.post(url, json=body, timeout=30).status_code == 401
    assert httpx.post(url, json=body, headers={"Authorization": "Bearer wrong"}, timeout=30).status_code == 401
    reply = httpx.post(url, json=body, headers=stack["up"].auth, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["reward"] == 1.0
    # NeMo-Gym's own 4xx for a bad row passes through unchanged (it names the field)
    bad = httpx.post(url, json={**body, "response": {"output": []}}, headers=stack["up"].auth, timeout=30)
    assert bad.status_code == 422 and "response" in bad.text
    servers = {s["name"]: s for s in httpx.get(f"{stack['head']}/server_instances", headers=stack["up"].auth,
                                                timeout=10).json()}
    sidecar = servers["nemo_mcqa"]["url"]
    assert sidecar != info["upstream"]
    assert httpx.post(f"{sidecar}/verify", json=body, timeout=30).status_code == 401
    # a body over the limit is refused before NeMo-Gym's server sees it
    big = {**body, "pad": "x" * (33 * 1024 * 1024)}
    assert httpx.post(url, json=big, headers=stack["up"].auth, timeout=60).status_code == 413


def test_nemo_gyms_500_is_a_masked_failure_not_a_reward(stack, nemo):
    """A recorded rollout sent back with its `reward` makes NeMo-Gym's equivalence_rule raise (its reply
    model gets `reward` twice): a 500 there, a masked `crash` here, never a score."""
    [recorded] = server_files(package_root(nemo.venv), "equivalence_rule").example_rollouts()[:1]
    assert recorded["reward"] == 1.0
    info = ready(stack, "nemo_equivalence_rule")
    raw = httpx.post(f"{info['upstream']}/verify", json=recorded, timeout=30)
    assert raw.status_code == 500, raw.text
    reply = httpx.post(f"{stack['head']}/servers/nemo_equivalence_rule/verify", json=recorded,
                       headers=stack["up"].auth, timeout=30)
    assert reply.status_code == 200, reply.text
    verdict = reply.json()
    assert verdict["mask_sample"] is True and verdict["failure_kind"] == "crash", verdict
    assert "500" in verdict["failure_reason"]


def test_killing_nemo_gyms_server_mid_collect(stack, nemo, nemo_side):
    """Every row accounted for (a right reward or a masked failure), none fabricated, the server back."""
    server = "equivalence_rule"
    files = server_files(package_root(nemo.venv), server)
    rows, _ = replay_rows(files)
    expected = {r["hashid"]: None for r in rows}  # a rollout's input comes back normalized: key by its hashid
    assert len(expected) == len(rows)
    agent = nemo_side.start_agent(files.instance, files.impl, ready(stack, f"nemo_{server}")["upstream"])
    try:
        for row, rollout in zip(rows, nemo_side.run_rows(agent, rows)):
            expected[row["hashid"]] = rollout["reward"]
    finally:
        nemo_side.stop_agent()
    many = [rows[i % len(rows)] for i in range(60)]
    before = ready(stack, f"nemo_{server}")
    import threading

    result: dict = {}
    collector = threading.Thread(target=lambda: result.update(zip(
        ("rollouts", "failures"), collect_through_gymserve(stack["head"], f"nemo_{server}_agent", many,
                                                           stack["workdir"], stack["env"]))))
    collector.start()
    calls = httpx.get(f"{stack['head']}/servers/replay/stats", headers=stack["up"].auth, timeout=10).json()["calls"]
    end = time.monotonic() + 120
    while time.monotonic() < end and httpx.get(f"{stack['head']}/servers/replay/stats", headers=stack["up"].auth,
                                               timeout=10).json()["calls"] < calls + 5:
        time.sleep(0.02)
    os.kill(before["upstream_pid"], signal.SIGKILL)
    collector.join(900)
    rollouts, failures = result["rollouts"], result["failures"]
    assert len(rollouts) + len(failures) == len(many) or len(rollouts) == len(many), (len(rollouts), len(failures))
    masked = [r for r in rollouts if r.get("mask_sample")]
    for r in rollouts:
        if r.get("mask_sample"):
            assert r.get("failure_kind") in ("crash", "upstream", "timeout"), r
        else:
            assert r["reward"] == expected[r["hashid"]]
    for f in failures:
        assert f.get("failure_kind"), f
    print(f"killed mid-collect: {len(rollouts) - len(masked)} scored, {len(masked)} masked, {len(failures)} failed")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        after = ready(stack, f"nemo_{server}")
        if after["restarts"] >= 1 and after["upstream_pid"]:
            break
        time.sleep(0.5)
    assert after["restarts"] == before["restarts"] + 1 and after["upstream_pid"] != before["upstream_pid"]
    again, again_failures = collect_through_gymserve(stack["head"], f"nemo_{server}_agent", rows, stack["workdir"],
                                                     stack["env"])
    assert again_failures == [] and [r["reward"] for r in again] == [expected[r["hashid"]] for r in again]
