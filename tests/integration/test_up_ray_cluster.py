"""`gymserve up --backend ray --address` joining a running Ray cluster of two nodes, both started on
this machine (`ray start --head` and `ray start --address`, one CPU each): math's two replicas land
one per node, and a model server (`models/hf`, a tiny model) serves the agent from a Ray replica.

The cluster is ours, so the teardown stops exactly its processes (never `ray stop`, which would
stop every Ray on the machine): those whose command line names its session folder, and their
children.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from services.core.ports import free_port
from tests.integration.up_helpers import Up, children

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RAY = str(Path(sys.executable).with_name("ray"))
STACK = """\
head: {host: 127.0.0.1, port: 0}
servers:
  math: {kind: resources/math, workers: 1, replicas: 2, num_cpus: 1}
  policy: {kind: models/hf, model: "${GS_TINY_MODEL}", max_model_len: 1024, default_max_tokens: 16, num_cpus: 0}
  math_simple_agent: {kind: agents/simple_agent, resources_server: math, model_server: policy, num_cpus: 0}
"""


def _pids_under(folder: str) -> list[int]:
    """Live processes whose command line names `folder` (Ray's daemons carry their session dir), and their children."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if folder in cmdline and state != "Z":
            found.append(int(entry.name))
    return found + [kid for pid in found for kid in children(pid)]


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _stop(folder: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _pids_under(folder):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        for _ in range(40):
            if not _pids_under(folder):
                return
            time.sleep(0.25)
    assert not _pids_under(folder), "a process of the test's Ray cluster is still alive"


@pytest.fixture(scope="module")
def cluster():
    temp = tempfile.mkdtemp(prefix="gsrc")  # short: Ray's Unix socket paths must stay short
    port = free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--disable-usage-stats"]
    raylets: list[int] = []
    try:
        for args in (["--head", "--port", str(port), "--temp-dir", temp, "--include-dashboard", "false",
                      "--dashboard-port", str(free_port())], ["--address", f"127.0.0.1:{port}"]):
            done = subprocess.run([RAY, "start", *args, *common], env=env, capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        for pid in _pids_under(temp):
            try:
                if Path(f"/proc/{pid}/exe").resolve().name == "raylet":
                    raylets.append(pid)
            except OSError:
                continue
        assert len(raylets) == 2, raylets
        yield f"127.0.0.1:{port}", temp, raylets
    finally:
        _stop(temp)
        shutil.rmtree(temp, ignore_errors=True)


def test_joining_a_two_node_cluster_spreads_replicas_and_serves_a_model(cluster, tmp_path):
    from services.models.hf.tiny import tiny_tool_model

    address, _, raylets = cluster
    stack = tmp_path / "stack.yaml"
    stack.write_text(STACK)
    up = Up("--backend", "ray", "--address", address, "-c", str(stack), "--ready-timeout", "400",
            env={"GS_TINY_MODEL": str(tiny_tool_model())})
    try:
        up.wait_for(r"all 4 servers ready", timeout_s=480)
        assert up.count(f"joining Ray at {address}") == 1
        head = up.wait_for(r"head: (http://\S+)").group(1)
        rows = {r["name"]: r for r in httpx.get(f"{head}/server_instances", headers=up.auth, timeout=10).json()}
        pids = rows["math"]["replicas"]["pids"]
        assert len(pids) == 2 and sorted(_parent(p) for p in pids) == sorted(raylets)  # one replica per node
        assert rows["policy"]["backend"] == "ray" and rows["policy"]["replicas"]["running"] == 1
        row = {"responses_create_params": {"input": [{"role": "user", "content": "2+2?"}], "max_output_tokens": 16},
               "expected_answer": "4"}
        reply = httpx.post(f"{head}/servers/math_simple_agent/run", json=row, headers=up.auth, timeout=300).json()
        assert reply["mask_sample"] is False and reply["reward"] in (0.0, 1.0), reply
        message = [i for i in reply["response"]["output"] if i["type"] == "message"][-1]
        assert message["generation_token_ids"] and len(message["generation_log_probs"]) == len(
            message["generation_token_ids"])
    finally:
        if up.proc.poll() is None:
            os.killpg(up.proc.pid, signal.SIGINT)
            code = up.wait(120)
        else:
            code = up.proc.returncode
        up.kill()
    assert code == 0, up.output[-3000:]
    # joined, not started: the cluster outlives `gymserve up` (and the fixture stops it)
    assert all(Path(f"/proc/{pid}").exists() for pid in raylets)
