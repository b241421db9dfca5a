"""Stateful sessions on `gymserve up --backend ray`: workplace and its agent on two replicas each,
driven by the scripted stub model (a real HTTP server standing in for a policy: two tool calls,
then an answer, so every rollout's reward is known to be 1.0).

Every call of a session must reach the replica that holds it; a SIGKILLed workplace replica's
sessions are rebuilt from their journals on the other replica; a SIGKILLed agent replica costs only
the rollouts it was running, honestly masked. One Ray/Serve stack is shared by the module.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
from pathlib import Path

import httpx
import pytest

from services.core.failures import FAILURE_KINDS
from services.resources.workplace.dataset import build_rows
from tests.integration.test_up_ray import processes_under, wait_until
from tests.integration.up_helpers import Up
from trainer.client import RolloutClient
from trainer.collect import collect, sibling

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

STACK = Path(__file__).parent / "stacks" / "ray_sessions.yaml"
AGENT = "workplace_simple_agent"
KEY = "ray-sessions-key-7f3a"
AUTH = {"Authorization": f"Bearer {KEY}"}
CONCURRENCY = 12
BASE = next(r for r in build_rows() if [c["name"] for c in r["ground_truth"]] == ["send_email"])


def _row(i: int) -> dict:
    """A send_email task with its own subject; the script looks something up, sends the email, answers."""
    truth = json.loads(BASE["ground_truth"][0]["arguments"]) if isinstance(BASE["ground_truth"][0]["arguments"], str) \
        else dict(BASE["ground_truth"][0]["arguments"])
    truth["subject"] = f"Launch {i}"
    script = [{"tool_calls": [{"name": "find_email_address", "arguments": {"name": "Bob"}}]},
              {"tool_calls": [{"name": "send_email", "arguments": truth}]},
              {"text": "Sent."}]
    # the step is read off the conversation: a rollout resumed elsewhere gets the same answers
    metadata = {"stub_script": json.dumps(script), "stub_turn": "input"}
    params = {**BASE["responses_create_params"], "metadata": metadata}
    return {**BASE, "responses_create_params": params,
            "ground_truth": [{"name": "send_email", "arguments": json.dumps(truth)}],
            "agent_ref": {"type": "responses_api_agents", "name": AGENT}}


@pytest.fixture(scope="module")
def stack():
    temp = tempfile.mkdtemp(prefix="gsrays")
    tmpdir = os.path.join(temp, "tmp")
    os.makedirs(tmpdir)
    up = Up("--backend", "ray", "-c", str(STACK), "--ray-temp-dir", os.path.join(temp, "ray"), "--num-cpus", "2",
            "--ready-timeout", "300", env={"GYMSERVE_API_KEY": KEY, "TMPDIR": tmpdir})
    try:
        up.wait_for(r"all 4 servers ready", timeout_s=420)
        head = up.wait_for(r"head: (http://\S+)").group(1)
        stores = list(Path(tmpdir).glob("gymserve-sessions-*"))
        assert len(stores) == 1, stores
        yield head, stores[0]
    finally:
        try:
            if up.proc.poll() is None:
                os.killpg(up.proc.pid, signal.SIGINT)
                code = up.wait(120)
                assert code == 0, up.output[-3000:]
            wait_until(lambda: not processes_under(temp), 30, "Ray's processes to exit")
            assert not list(Path(tmpdir).glob("gymserve-sessions-*")), "the journal folder was left behind"
        finally:
            up.kill()
            shutil.rmtree(temp, ignore_errors=True)


def _replicas(head: str, name: str) -> dict:
    rows = httpx.get(f"{head}/server_instances", headers=AUTH, timeout=10).json()
    return next(r for r in rows if r["name"] == name)["replicas"]


def _journals(store: Path) -> list[Path]:
    return list(store.glob("*.jsonl"))


def _collect(head: str, n: int, out: Path, monkeypatch, on_record=None):
    monkeypatch.setenv("GYMSERVE_API_KEY", KEY)
    client = RolloutClient(head, concurrency=CONCURRENCY, deadline_s=300)
    stats = asyncio.run(collect([_row(i) for i in range(n)], out, client=client, on_record=on_record))
    rollouts = [json.loads(line) for line in out.read_text().splitlines()]
    failures_path = sibling(out, "_failures.jsonl")
    failures = [json.loads(line) for line in failures_path.read_text().splitlines()] if failures_path.exists() else []
    assert stats.done == n and len(rollouts) + len(failures) == n
    assert sorted(r["_ng_task_index"] for r in rollouts + failures) == list(range(n)), "a row is missing or doubled"
    print(f"\n{n} rows: {len(rollouts)} scored, {len(failures)} masked "
          f"{sorted({(f['failure_kind'], f['failure_reason'][:160]) for f in failures})}")
    for f in failures:  # an honest failure is masked, says why, and carries no reward
        assert f["mask_sample"] is True and f["failure_kind"] in FAILURE_KINDS and f["reward"] is None, f
    return rollouts, failures


def test_every_rollout_of_a_two_replica_stateful_environment_scores(stack, tmp_path, monkeypatch):
    head, store = stack
    assert _replicas(head, "workplace")["running"] == 2
    rollouts, failures = _collect(head, 200, tmp_path / "r.jsonl", monkeypatch)
    assert failures == [], (len(failures), [(f["failure_kind"], f["failure_reason"]) for f in failures[:5]])
    assert [r["reward"] for r in rollouts] == [1.0] * 200, [r for r in rollouts if r["reward"] != 1.0][:2]
    # the sessions were spread over both replicas (a session id names its replica), and each replica
    # answers on an address of its own, next to Serve's proxy: where the agents sent the sessions' calls
    owners = {r["session_id"].split(".", 1)[0] for r in rollouts}
    registry = [json.loads(p.read_text()) for p in (store / "replicas").glob("*.json")]
    assert owners == {r["id"] for r in registry} and len(owners) == 2, (owners, registry)
    for replica in registry:
        assert httpx.get(f"{replica['url']}/health", timeout=10).json() == {"status": "ok"}
        assert httpx.post(f"{replica['url']}/seed_session", json={}, timeout=10).status_code == 401, "keyless"
    assert wait_until(lambda: not _journals(store), 10, "finished sessions' journals to go") is True


def test_sessions_of_a_killed_workplace_replica_are_rebuilt(stack, tmp_path, monkeypatch):
    head, store = stack
    n = 600
    victim = _replicas(head, "workplace")["pids"][0]
    killed: list[int] = []

    def on_record(_record: dict, stats) -> None:
        if not killed and stats.done >= n // 5:
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    rollouts, failures = _collect(head, n, tmp_path / "r.jsonl", monkeypatch, on_record)
    assert killed == [victim]
    assert all(r["reward"] == 1.0 and not r.get("mask_sample") for r in rollouts), \
        [r for r in rollouts if r["reward"] != 1.0][:2]  # nothing fabricated: every scored rollout is right
    assert len(failures) <= n * 0.02, [f["failure_reason"] for f in failures[:5]]
    wait_until(lambda: _replicas(head, "workplace")["running"] == 2, 120, "Ray to replace the killed replica")


def test_a_killed_agent_replica_costs_only_honest_masks(stack, tmp_path, monkeypatch):
    head, _store = stack
    n = 600
    victim = _replicas(head, AGENT)["pids"][0]
    killed: list[int] = []

    def on_record(_record: dict, stats) -> None:
        if not killed and stats.done >= n // 5:
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    rollouts, failures = _collect(head, n, tmp_path / "r.jsonl", monkeypatch, on_record)
    assert killed == [victim]
    assert all(r["reward"] == 1.0 and not r.get("mask_sample") for r in rollouts)
    assert len(failures) <= n * 0.02, [f["failure_reason"] for f in failures[:5]]
