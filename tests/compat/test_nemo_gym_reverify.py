"""`gym eval reverify` (NeMo-Gym 0.7.0's own command, which always starts its own servers) re-scores
rollouts with a gymserve environment that NeMo-Gym's launcher starts itself, through
`deploy/nemo_gym/resources_servers/gymserve` (a NeMo-Gym server folder whose `app.py` serves the
gymserve kind the config block names). The rollouts come from NeMo-Gym's own collector against our
head; their rewards are overwritten before re-verification, so every reward in the output was computed
again by our server."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from services.core.ports import free_port
from tests.compat.nemo_gym import MATH_ROWS
from tests.integration.up_helpers import Up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
STACK = Path(__file__).parent / "stacks" / "nemo_collect.yaml"


def _collect(nemo, workdir: Path) -> list[dict]:
    launcher = Up("-c", str(STACK), env={"GYMSERVE_NO_AUTH": "1"})
    try:
        launcher.wait_for(r"all 4 servers ready", timeout_s=180)
        host, port = launcher.wait_for(r"head on (http://\S+)").group(1).removeprefix("http://").rsplit(":", 1)
        (workdir / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in MATH_ROWS))
        done = nemo.run("ng_collect_rollouts", f"+head_server={{host:{host},port:{port}}}", "+agent_name=math_simple_agent",
                        "+input_jsonl_fpath=rows.jsonl", "+output_jsonl_fpath=rollouts.jsonl", "+num_repeats=2",
                        cwd=workdir)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    finally:
        launcher.kill()
    return [json.loads(line) for line in (workdir / "rollouts.jsonl").read_text().splitlines()]


def test_gym_eval_reverify_rescores_with_a_gymserve_environment_it_starts(nemo, workdir):
    collected = _collect(nemo, workdir)
    right = {(r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in collected}
    assert sorted(right.values()) == [0.0, 0.0, 1.0, 1.0]
    (workdir / "rollouts.jsonl").write_text("".join(json.dumps({**r, "reward": 0.5}) + "\n" for r in collected))
    # NeMo-Gym's config: one resources server, run by gymserve's folder with gymserve's virtualenv
    (workdir / "config.yaml").write_text(yaml.safe_dump({"math": {"resources_servers": {"gymserve": {
        "entrypoint": "app.py", "kind": "resources/math", "domain": "math", "math_verify_timeout_s": 30}}}}))
    venv = workdir / "venvs" / "resources_servers" / "gymserve" / ".venv"
    venv.parent.mkdir(parents=True)
    venv.symlink_to(sys.prefix)
    nemo.env["NEMO_GYM_EXTRA_ROOTS"] = str(ROOT / "deploy" / "nemo_gym")
    try:
        done = nemo.run("gym", "eval", "reverify", "+config_paths=[config.yaml]",
                        f"+head_server={{host:127.0.0.1,port:{free_port()}}}", f"+uv_venv_dir={workdir / 'venvs'}",
                        "+skip_venv_if_present=true", "+force=true",
                        "+materialized_inputs_jsonl_fpath=rollouts_materialized_inputs.jsonl",
                        "+rollouts_jsonl_fpath=rollouts.jsonl", "+output_jsonl_fpath=reverified.jsonl", cwd=workdir)
    finally:
        del nemo.env["NEMO_GYM_EXTRA_ROOTS"]
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "Starting `math` from venv" in done.stdout and "resources_servers/gymserve" in done.stdout
    # math's reverify mode is `unknown` (its verifier may ask a judge): NeMo-Gym re-scores it with --force,
    # into files prefixed `unsafe_`
    rescored = [json.loads(line) for line in (workdir / "unsafe_reverified.jsonl").read_text().splitlines()]
    assert {(r["_ng_task_index"], r["_ng_rollout_index"]): r["reward"] for r in rescored} == right
    assert all(r["mask_sample"] is False for r in rescored)
    assert (workdir / "unsafe_reverified_failures.jsonl").read_text().strip() == ""
    [metrics] = json.loads((workdir / "unsafe_reverified_aggregate_metrics.json").read_text())
    assert metrics["key_metrics"]["mean/reward"] == pytest.approx(0.5)
    # the server NeMo-Gym started is gone with it: nothing of ours is left running
    leftover = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid).endswith("app.py")
                and str(workdir) in _cmdline(pid)]
    assert not leftover


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
