"""`gymserve up --backend ray` on a real local Ray (2 CPUs): math on two replicas, an agent,
the scripted stub model (a real HTTP server standing in for a policy, so rewards are known)
and an autoscaling stub, all as Ray Serve deployments behind the unchanged head.

One Ray/Serve instance is shared by the module (Ray takes most of a minute to start on a
loaded 2-core box). Ray's session folder lives in a short temporary folder (its Unix socket
paths must stay short) that the teardown removes after checking that no Ray process is left.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest

from tests.integration.up_helpers import Up
from trainer.client import RolloutClient
from trainer.collect import collect, sibling

# generous: Ray starts slowly and its workers get little CPU on a machine busy with other jobs
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STACK = Path(__file__).parent / "stacks" / "ray_test.yaml"
SERVERS = ("math", "policy", "math_simple_agent", "elastic")
AGENT = "math_simple_agent"
FAILURE_KINDS = {"timeout", "crash", "bad_request", "upstream", "sandbox"}
KEY = "ray-test-key-5c1e"
AUTH = {"Authorization": f"Bearer {KEY}"}


def processes_under(folder: str) -> list[str]:
    """Command lines of live processes that mention `folder` (Ray's daemons carry their session dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if folder in cmdline and state != "Z":
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}; last: {last!r}")


@pytest.fixture(scope="module")
def ray_up():
    temp = tempfile.mkdtemp(prefix="gsray")
    up = Up("--backend", "ray", "-c", str(STACK), "--ray-temp-dir", temp, "--num-cpus", "2",
            "--ready-timeout", "300", env={"GYMSERVE_API_KEY": KEY})
    try:
        up.wait_for(r"all 5 servers ready", timeout_s=360)
        head = up.wait_for(r"head: (http://\S+)").group(1)
        yield up, head
    finally:
        try:
            if up.proc.poll() is None:
                os.killpg(up.proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole group
                code = up.wait(120)
                assert code == 0, up.output[-3000:]
                assert "all servers stopped and Ray shut down" in up.output
            wait_until(lambda: not processes_under(temp), 30, "Ray's processes to exit")
        finally:
            up.kill()
            shutil.rmtree(temp, ignore_errors=True)


def _row(i: int) -> dict:
    # the stub always answers 4: even rows are right (reward 1), odd rows wrong (reward 0)
    return {"responses_create_params": {"input": [{"role": "user", "content": f"row {i}: 2+2?"}]},
            "expected_answer": "4" if i % 2 == 0 else "5",
            "agent_ref": {"type": "responses_api_agents", "name": AGENT}}


def _instances(head: str) -> dict[str, dict]:
    return {r["name"]: r for r in httpx.get(f"{head}/server_instances", headers=AUTH, timeout=10).json()}


def _health(head: str) -> dict[str, dict]:
    return {r["name"]: r for r in httpx.get(f"{head}/health/servers", headers=AUTH, timeout=30).json()["servers"]}


def test_every_deployment_is_registered_under_its_name(ray_up):
    up, head = ray_up
    rows = _instances(head)
    proxy = rows["math"]["url"].rsplit("/", 1)[0]
    for name in SERVERS:
        row = rows[name]
        assert row["url"] == f"{proxy}/{name}" and row["backend"] == "ray" and row["status"] == "registered"
    assert rows["math"]["replicas"]["running"] == 2 and len(rows["math"]["replicas"]["pids"]) == 2
    health = httpx.get(f"{head}/health/servers", headers=AUTH, timeout=30).json()
    assert health["ready"] == health["total"] == len(SERVERS)
    assert {r["name"]: r["replicas"]["running"] for r in health["servers"]}["math"] == 2
    assert "math" in httpx.get(f"{head}/global_config_dict_yaml", headers=AUTH, timeout=10).json()
    assert up.count(r"all 5 servers ready") == 1


def test_verify_and_run_through_the_head_and_directly(ray_up):
    _, head = ray_up
    from gymserve.testing import verify_body

    right = httpx.post(f"{head}/servers/math/verify", json=verify_body("\\boxed{4}", expected_answer="4"),
                       headers=AUTH, timeout=60)
    wrong = httpx.post(f"{head}/servers/math/verify", json=verify_body("\\boxed{3}", expected_answer="4"),
                       headers=AUTH, timeout=60)
    assert right.status_code == 200 and right.json()["reward"] == 1.0
    assert wrong.status_code == 200 and wrong.json()["reward"] == 0.0
    bad = httpx.post(f"{head}/servers/math/verify", json={"response": {}}, headers=AUTH, timeout=60)
    assert 400 <= bad.status_code < 500, bad.text
    run = httpx.post(f"{head}/servers/{AGENT}/run", json=_row(0), headers=AUTH, timeout=60)
    assert run.status_code == 200 and run.json()["reward"] == 1.0
    direct = _instances(head)[AGENT]["url"]
    assert httpx.post(f"{direct}/run", json=_row(1), headers=AUTH, timeout=60).json()["reward"] == 0.0
    assert httpx.get(f"{direct}/health", headers=AUTH, timeout=10).json() == {"status": "ok"}


def test_collect_survives_a_killed_math_replica(ray_up, tmp_path, monkeypatch):
    """SIGKILL one math replica mid-collect: every row ends scored correctly or honestly masked,
    Ray replaces the replica, and the head's health view shows the restart."""
    _, head = ray_up
    n = 2000
    before = _instances(head)["math"]["replicas"]
    victim = before["pids"][0]
    killed: list[int] = []

    def on_record(_record: dict, stats) -> None:
        if not killed and stats.done >= n // 5:
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    out = tmp_path / "rollouts.jsonl"
    monkeypatch.setenv("GYMSERVE_API_KEY", KEY)
    client = RolloutClient(head, concurrency=32, deadline_s=300)
    stats = asyncio.run(collect([_row(i) for i in range(n)], out, client=client, on_record=on_record))
    assert killed == [victim]
    rollouts = [json.loads(line) for line in out.read_text().splitlines()]
    failures = [json.loads(line) for line in sibling(out, "_failures.jsonl").read_text().splitlines()]
    assert stats.done == n and len(rollouts) + len(failures) == n
    assert sorted(r["_ng_task_index"] for r in rollouts + failures) == list(range(n)), "a row is missing or doubled"
    for r in rollouts:  # nothing fabricated: each reward is the true one
        assert r["reward"] == (1.0 if r["_ng_task_index"] % 2 == 0 else 0.0), r
        assert not r.get("mask_sample")
    for f in failures:  # an honest failure is masked, says why, and carries no reward
        assert f["mask_sample"] is True and f["failure_kind"] in FAILURE_KINDS and f["reward"] is None, f
    # only rollouts in flight at kill time can fail: the client holds at most `concurrency` of them
    assert len(failures) <= client.concurrency, f"{len(failures)} failures: {failures[:3]}"

    def replaced():
        replicas = _health(head)["math"]["replicas"]
        ok = replicas["running"] == 2 and victim not in replicas["pids"] and replicas["restarts"] >= 1
        return replicas if ok else None

    replicas = wait_until(replaced, 90, "Ray to replace the killed math replica")
    assert replicas["restarts"] == before["restarts"] + 1
    assert _health(head)["math"]["healthy"] is True


def test_autoscaling_from_one_to_two_replicas_under_load(ray_up):
    _, head = ray_up
    assert _instances(head)["elastic"]["replicas"]["running"] == 1
    body = {"input": "hi", "metadata": {"stub_script": json.dumps([{"sleep": 1.0, "text": "slow"}])}}

    async def load(stop: asyncio.Event) -> int:
        async with httpx.AsyncClient(timeout=60, headers=AUTH) as client:
            async def one() -> None:
                while not stop.is_set():  # a fresh session each call: every call sleeps
                    reply = await client.post(f"{head}/servers/elastic/v1/responses", json=body,
                                              headers={"X-Session-Id": uuid.uuid4().hex})
                    assert reply.status_code == 200, reply.text

            tasks = [asyncio.create_task(one()) for _ in range(6)]
            deadline = time.monotonic() + 150
            running = 1
            while time.monotonic() < deadline and running < 2:
                await asyncio.sleep(1.0)
                rows = (await client.get(f"{head}/server_instances")).json()
                running = next(r for r in rows if r["name"] == "elastic")["replicas"]["running"]
            stop.set()
            await asyncio.gather(*tasks)
            return running

    assert asyncio.run(load(asyncio.Event())) == 2
