"""`make compose-up` for real: build the image, start docker-compose.yml, collect from the host.

Everything is real: Docker's engine (installed and started here when missing; CI is root),
the image built from Debian packages, every server of the stack in its own container, and
`gymserve collect` on this machine talking only to the head published on 127.0.0.1 (a free
port, its own compose project name, so nothing else running is disturbed). The agents are
registered under in-network names (`http://math_simple_agent:8000`) that do not resolve here,
so every rollout goes through the head's proxy. Slow: minutes with a warm build cache.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
KINDS = {"timeout", "crash", "bad_request", "upstream", "sandbox"}
MAX_OUTPUT_TOKENS = 24  # short generations: the test checks plumbing, not the policy
# rows per environment in the collect: each proves that environment scores through the head's proxy;
# more repeat the same path, and workplace's ~3k-token prompts cost the CPU policy seconds each
ROWS_PER_ENVIRONMENT = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    def __init__(self, project: str, port: int, env: dict[str, str]) -> None:
        self.project, self.port, self.env = project, port, env
        self.head = f"http://127.0.0.1:{port}"

    @property
    def auth(self) -> dict[str, str]:
        """The key `compose.sh up` generated (no GYMSERVE_API_KEY given)."""
        return {"Authorization": f"Bearer {Path(self.env['GYMSERVE_API_KEY_FILE']).read_text().strip()}"}

    def script(self, *args: str, timeout: float = 2400, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "deploy/docker/compose.sh", *args], cwd=ROOT, env={**self.env, **extra_env},
                              timeout=timeout, text=True, capture_output=True)

    def docker(self, *args: str) -> str:
        out = subprocess.run(["docker", *args], check=True, capture_output=True, text=True, timeout=120)
        return out.stdout.strip()

    def containers(self, service: str | None = None) -> list[str]:
        filters = ["--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        return self.docker("ps", "-aq", *filters).split()

    def inspect(self, container: str, fmt: str) -> str:
        return self.docker("inspect", "-f", fmt, container)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("compose")
    pidfile = tmp / "dockerd.pid"
    project = f"gymserve-e2e-{os.getpid()}"
    env = {**os.environ, "COMPOSE_PROJECT_NAME": project, "GYMSERVE_HEAD_PORT": str(_free_port()),
           "GYMSERVE_HEAD_BIND": "127.0.0.1", "GYMSERVE_ENGINE_PIDFILE": str(pidfile),
           "GYMSERVE_UP_TIMEOUT_S": "900", "GYMSERVE_API_KEY": "",
           # the generated key goes to files of this test, not the checkout's .env or the user's key file
           "GYMSERVE_ENV_FILE": str(tmp / "compose.env"), "GYMSERVE_API_KEY_FILE": str(tmp / "api_key")}
    env.pop("GYMSERVE_HEAD_URL", None)
    st = Stack(project, int(env["GYMSERVE_HEAD_PORT"]), env)
    try:
        up = st.script("up")
        assert up.returncode == 0, f"compose up failed:\n{up.stdout[-3000:]}\n{up.stderr[-6000:]}"
        yield st
    finally:
        st.script("down", timeout=600, GYMSERVE_DOWN_VOLUMES="1", GYMSERVE_SKIP_BUILD="1")
        if pidfile.exists():  # a dockerd this test started: stop it again
            pid = int(pidfile.read_text())
            os.kill(pid, signal.SIGTERM)
            for _ in range(120):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.5)


def _example_rows(agents: set[str], per_environment: int | None = None) -> dict[str, list[dict[str, Any]]]:
    """The bundled example rows (the first `per_environment` of each file, else all) whose agent runs in
    the stack, with short generations."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((ROOT / "datasets").glob("*/example.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            if row.get("agent_ref", {}).get("name") in agents:
                row["responses_create_params"]["max_output_tokens"] = MAX_OUTPUT_TOKENS
                mine = rows.setdefault(path.parent.name, [])
                if per_environment is None or len(mine) < per_environment:
                    mine.append(row)
    return rows


def _collect(stack: Stack, rows: list[dict[str, Any]], tmp: Path, *, repeats: int = 1
             ) -> subprocess.Popen[str]:
    (tmp / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {k: v for k, v in os.environ.items() if k != "GYMSERVE_HEAD_URL"}
    env["GYMSERVE_API_KEY_FILE"] = stack.env["GYMSERVE_API_KEY_FILE"]  # found like the user's key file
    return subprocess.Popen([sys.executable, "-m", "gymserve", "collect", "-i", str(tmp / "rows.jsonl"),
                             "-o", str(tmp / "out.jsonl"), "--head", stack.head, "--repeats", str(repeats),
                             "--concurrency", "8", "--deadline", "600", "--no-progress"],
                            cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _records(tmp: Path) -> list[dict[str, Any]]:
    out = []
    for name in ("out.jsonl", "out_failures.jsonl"):
        path = tmp / name
        if path.exists():
            out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return out


# environments whose judge is the embedded policy itself (docker-compose.yml: judge_model_server=policy_model)
JUDGED_BY_THE_POLICY = {"equivalence_llm_judge"}


def _honest(record: dict[str, Any]) -> bool:
    """Scored (a numeric reward, not masked) or an honest failure (masked, a kind, no reward)."""
    if record.get("mask_sample"):
        return record.get("reward") is None and record.get("failure_kind") in KINDS and bool(record.get("failure_reason"))
    reward = record.get("reward")
    return isinstance(reward, (int, float)) and not isinstance(reward, bool)


def test_every_service_is_healthy_and_only_the_head_is_published(stack: Stack):
    services = set(stack.docker("ps", "--filter",
                                f"label=com.docker.compose.project={stack.project}", "--format",
                                '{{.Label "com.docker.compose.service"}}').split())
    listed = {row["name"] for row in httpx.get(f"{stack.head}/server_instances", headers=stack.auth, timeout=10).json()}
    assert {"policy_model", "reward_model", "math", "math_simple_agent", "code", "workplace"} <= services
    assert services - {"head"} <= listed, sorted(services - listed)
    for container in stack.containers():
        assert "healthy" == stack.inspect(container, "{{.State.Health.Status}}")
        assert stack.inspect(container, "{{.Config.User}}") not in ("", "0", "root")  # non-root servers
        ports = json.loads(stack.inspect(container, "{{json .NetworkSettings.Ports}}")) or {}
        bound = [b for binds in ports.values() if binds for b in binds]
        service = stack.inspect(container, '{{index .Config.Labels "com.docker.compose.service"}}')
        if service == "head":
            assert bound and all(b["HostIp"] == "127.0.0.1" for b in bound), bound
        else:
            assert not bound, (service, bound)
    # the registered URLs are the in-network names: not reachable from here, hence the proxy
    urls = {row["name"]: row["url"] for row in httpx.get(f"{stack.head}/server_instances", headers=stack.auth, timeout=10).json()}
    assert urls["math_simple_agent"] == "http://math_simple_agent:8000"


def test_collect_from_the_host_scores_every_environment(stack: Stack, tmp_path: Path):
    agents = {row["name"] for row in httpx.get(f"{stack.head}/server_instances", headers=stack.auth, timeout=10).json()}
    by_env = _example_rows(agents, ROWS_PER_ENVIRONMENT)
    assert len(by_env) >= 9, sorted(by_env)
    rows = [r for env_rows in by_env.values() for r in env_rows]
    proc = _collect(stack, rows, tmp_path)
    output, _ = proc.communicate(timeout=1800)
    assert proc.returncode == 0, output[-3000:]
    records = _records(tmp_path)
    assert len(records) == len(rows), output[-3000:]
    assert sorted(r["_ng_task_index"] for r in records) == list(range(len(rows)))
    bad = [r for r in records if not _honest(r)]
    assert not bad, bad[:3]
    for env, env_rows in by_env.items():
        agent = env_rows[0]["agent_ref"]["name"]
        mine = [r for r in records if r["agent_ref"]["name"] == agent]
        if env in JUDGED_BY_THE_POLICY:
            # the 135M embedded policy is a weak judge: a verdict or a masked sample that names the judge,
            # never a reward made up for a reply it could not read
            assert all(not r.get("mask_sample") or r["failure_reason"].startswith("judge policy_model")
                       for r in mine), [r.get("failure_reason") for r in mine][:2]
            continue
        scored = [r for r in mine if not r.get("mask_sample")]
        assert scored, (env, [r.get("failure_reason") for r in mine][:2])


def test_a_crashed_resource_container_loses_and_fabricates_nothing_and_comes_back(stack: Stack, tmp_path: Path):
    """SIGKILL of the math container's init process mid-collect (a crash, like an OOM kill; `docker kill`
    itself counts as a manual stop, which restart policies leave down)."""
    agents = {row["name"] for row in httpx.get(f"{stack.head}/server_instances", headers=stack.auth, timeout=10).json()}
    rows = _example_rows(agents)["math"]
    repeats = 4
    (container,) = stack.containers("math")
    restarts = int(stack.inspect(container, "{{.RestartCount}}"))
    proc = _collect(stack, rows, tmp_path, repeats=repeats)
    deadline = time.monotonic() + 600
    while not _records(tmp_path) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    written_at_kill, running_at_kill = len(_records(tmp_path)), proc.poll() is None
    os.kill(int(stack.inspect(container, "{{.State.Pid}}")), signal.SIGKILL)
    output, _ = proc.communicate(timeout=1800)
    assert proc.returncode == 0, output[-3000:]
    # the kill landed mid-collect: some rollouts were written, the rest were still to come
    assert running_at_kill and 0 < written_at_kill < len(rows) * repeats, (written_at_kill, output[-3000:])
    records = _records(tmp_path)
    keys = sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in records)
    assert keys == sorted((t, k) for t in range(len(rows)) for k in range(repeats))  # none lost, none doubled
    bad = [r for r in records if not _honest(r)]
    assert not bad, bad[:3]
    for r in records:  # a failure is never a fabricated 0: masked records carry no reward
        if r.get("mask_sample"):
            assert r["reward"] is None
    # the container comes back by itself (restart policy) and turns healthy again
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if int(stack.inspect(container, "{{.RestartCount}}")) > restarts and \
                stack.inspect(container, "{{.State.Health.Status}}") == "healthy":
            break
        time.sleep(2)
    else:
        pytest.fail(f"math did not come back: {stack.inspect(container, '{{json .State}}')}")


def test_compose_down_leaves_no_container_network_or_volume(stack: Stack):
    down = stack.script("down", timeout=600, GYMSERVE_DOWN_VOLUMES="1", GYMSERVE_SKIP_BUILD="1")
    assert down.returncode == 0, down.stderr[-3000:]
    label = f"label=com.docker.compose.project={stack.project}"
    assert stack.docker("ps", "-aq", "--filter", label) == ""
    assert stack.docker("network", "ls", "-q", "--filter", label) == ""
    assert stack.docker("volume", "ls", "-q", "--filter", label) == ""
