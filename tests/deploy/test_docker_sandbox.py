"""The docker sandbox provider with the real engine (installed and started when missing, stopped again
if this started it) and the workspace image built offline from Debian packages: `swe` grades the gold
patch 1 and an empty one 0 in fresh containers, and a server killed with SIGKILL leaves containers
that the next server's janitor removes. Nothing is left behind. Slow: minutes on a cold image cache."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from gymserve.testing import ServerProcess, verify_body
from tests.docker_engine import containers, engine_and_image

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
ROOT = Path(__file__).resolve().parents[2]
SWE = [json.loads(line) for line in (ROOT / "datasets/swe/example.jsonl").read_text().splitlines()]
TERMINAL = [json.loads(line) for line in (ROOT / "datasets/terminal/example.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    yield from engine_and_image()


def body(row: dict[str, Any], text: str) -> dict[str, Any]:
    fields = {k: v for k, v in row.items() if k != "responses_create_params"}
    return verify_body(text, responses_create_params=row["responses_create_params"], **fields)


def test_swe_in_containers(image: str) -> None:
    before = set(containers())
    with ServerProcess("resources/swe", "sandbox_provider=docker", f"sandbox_image={image}", "warm_pool=1",
                       ready_timeout_s=300) as env:
        assert env.get("/ready").json()["sandbox"]["provider"] == "docker"
        row = SWE[0]
        gold = env.post("/verify", body(row, f"```diff\n{row['patch']}```"), timeout=300).json()
        assert gold["reward"] == 1.0 and gold["mask_sample"] is False, gold
        empty = env.post("/verify", body(row, "no idea"), timeout=300).json()
        assert empty["reward"] == 0.0 and empty["mask_sample"] is False
        sid = env.post("/seed_session", row, timeout=300).json()["session_id"]
        h = {"X-Session-Id": sid}
        who = env.post("/bash", {"command": "id -u; cat /proc/self/status | grep CapBnd"}, headers=h).json()
        assert who["stdout"].split()[0] == "65534" and who["stdout"].split()[-1].strip("0") == "", who
        assert env.post("/apply_patch", {"patch": row["patch"]}, headers=h).json()["exit_code"] == 0
        graded = env.post("/verify", body(row, "done"), headers=h, timeout=300).json()
        assert graded["reward"] == 1.0 and graded["patch_source"] == "session", graded
    assert set(containers()) <= before, "workspace containers left behind"


def test_killed_server_containers_are_reclaimed(image: str) -> None:
    before = set(containers())
    first = ServerProcess("resources/terminal", "sandbox_provider=docker", f"sandbox_image={image}", "warm_pool=2",
                          ready_timeout_s=300).start()
    try:
        assert first.post("/seed_session", TERMINAL[0], timeout=300).status_code == 200
        assert first.proc is not None
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.stop()
    assert set(containers()) - before, "the killed server had no container to leave behind"
    with ServerProcess("resources/terminal", "sandbox_provider=docker", f"sandbox_image={image}", "warm_pool=0",
                       ready_timeout_s=300):
        assert set(containers()) <= before, "the janitor left a dead server's containers"


def test_swe_row_with_its_own_task_image(image: str, tmp_path: Path) -> None:
    """A per-row image holding the repository in /testbed (SWE-bench's layout), built locally FROM the
    workspace image with a plain `docker build` (no registry, no network), then removed."""
    row = next(r for r in SWE if r["repo_snapshot"] == "intervals")
    tag = f"gymserve-test-task-intervals:{os.getpid()}"
    (tmp_path / "Dockerfile").write_text(f"FROM {image}\nCOPY --chown=65534:65534 repo /testbed\n")
    shutil.copytree(ROOT / "datasets/swe/repos/intervals", tmp_path / "repo")
    built = subprocess.run(["docker", "build", "-q", "-t", tag, str(tmp_path)], capture_output=True, text=True,
                           timeout=600, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    assert built.returncode == 0, built.stderr
    try:
        task_row = {k: v for k, v in row.items() if k != "repo_snapshot"} | {"image": tag}
        with ServerProcess("resources/swe", "sandbox_provider=docker", f"sandbox_image={image}", "warm_pool=0",
                           ready_timeout_s=300) as env:
            gold = env.post("/verify", body(task_row, f"```diff\n{row['patch']}```"), timeout=300).json()
            assert gold["reward"] == 1.0 and gold["mask_sample"] is False, gold
            wrong = env.post("/verify", body(task_row, "```diff\n" + row["patch"].replace("<=", ">=") + "```"),
                             timeout=300).json()
            assert wrong["reward"] == 0.0 and wrong["mask_sample"] is False, wrong
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
