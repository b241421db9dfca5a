"""Agents across the two projects: NeMo-Gym 0.7.0's own `simple_agent` (started from its
virtualenv on 127.0.0.1) runs rollouts against our math resource server and our `models/stub`
model server, and our `simple_agent` runs rollouts against NeMo-Gym's own mcqa resources server.

NeMo-Gym's servers are started as its `gym env start` starts them: the server's `app.py` with the
resolved config in `NEMO_GYM_CONFIG_DICT` and the instance name in `NEMO_GYM_CONFIG_PATH`. The
config is the one our head serves on `/global_config_dict_yaml`, plus the NeMo-Gym server's entry.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from services.core.ports import free_port
from tests.compat.nemo_gym import MATH_ROWS
from tests.integration.up_helpers import Up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first compat test may install NeMo-Gym

STACK = Path(__file__).parent / "stacks" / "nemo_agents.yaml"


@pytest.fixture(scope="module")
def head():
    launcher = Up("-c", str(STACK), env={"GYMSERVE_NO_AUTH": "1"})
    try:
        launcher.wait_for(r"all 5 servers ready", timeout_s=180)
        url = launcher.wait_for(r"head on (http://\S+)").group(1)
        yield url
    finally:
        launcher.kill()


class NeMoServer:
    """One NeMo-Gym server process (`<kind>/<impl>/app.py` of its package) on a free loopback port."""

    def __init__(self, nemo, head_url: str, name: str, server_type: str, impl: str, options: dict, cwd: Path):
        config = yaml.safe_load(httpx.get(f"{head_url}/global_config_dict_yaml", timeout=10).json())
        host, port = head_url.removeprefix("http://").rsplit(":", 1)
        self.port = free_port()
        config[name] = {server_type: {impl: {"entrypoint": "app.py", "host": "127.0.0.1", "port": self.port,
                                              **options}}}
        config["head_server"] = {"host": host, "port": int(port)}
        config.setdefault("dry_run", False)
        [app] = list(nemo.venv.glob(f"lib/python3.*/site-packages/{server_type}/{impl}/app.py"))
        env = {**nemo.env, "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config), "NEMO_GYM_CONFIG_PATH": name}
        self.log = cwd / f"{name}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([str(nemo.venv / "bin" / "python"), str(app)], cwd=app.parent, env=env,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 120) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            assert self.proc.poll() is None, self.log.read_text()[-4000:]
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(self.log.read_text()[-4000:])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_nemo_gyms_simple_agent_runs_on_our_servers(nemo, head, workdir):
    agent = NeMoServer(nemo, head, "nemo_math_agent", "responses_api_agents", "simple_agent",
                       {"resources_server": {"type": "resources_servers", "name": "math"},
                        "model_server": {"type": "responses_api_models", "name": "policy_model"}}, workdir)
    try:
        agent.wait_ready()
        rollouts = [httpx.post(f"{agent.url}/run", json=row, timeout=120) for row in MATH_ROWS]
    finally:
        agent.stop()
    assert [r.status_code for r in rollouts] == [200, 200], [r.text[-2000:] for r in rollouts]
    assert [r.json()["reward"] for r in rollouts] == [1.0, 0.0]
    assert rollouts[0].json()["response"]["output"][-1]["content"][0]["text"] == "2 + 2 = \\boxed{4}"


def test_our_simple_agent_runs_on_nemo_gyms_mcqa_server(nemo, head, workdir):
    """NeMo-Gym's mcqa server registers with our head as `nemo_mcqa`, the resources server our
    `nemo_mcqa_agent` names; its example rows run unchanged, the stub policy answering `\\boxed{B}`."""
    [data] = list(nemo.venv.glob("lib/python3.*/site-packages/resources_servers/mcqa/data"))
    rows = [json.loads(line) for line in (data / "example.jsonl").read_text().splitlines()]
    resources = NeMoServer(nemo, head, "nemo_mcqa", "resources_servers", "mcqa", {"grading_mode": None}, workdir)
    try:
        resources.wait_ready()
        registered = httpx.post(f"{head}/register", timeout=10, json={
            "name": "nemo_mcqa", "kind": "resources/mcqa", "url": resources.url, "ttl_s": 3600})
        assert registered.status_code == 200, registered.text
        agent = {r["name"]: r["url"] for r in httpx.get(f"{head}/server_instances", timeout=10).json()}
        rollouts = [httpx.post(f"{agent['nemo_mcqa_agent']}/run", json=row, timeout=120) for row in rows]
    finally:
        resources.stop()
    assert [r.status_code for r in rollouts] == [200] * len(rows), [r.text[-2000:] for r in rollouts]
    rewards = [r.json()["reward"] for r in rollouts]
    assert rewards == [1.0 if row["expected_answer"] == "B" else 0.0 for row in rows]
    assert 0 < sum(rewards) < len(rows)
