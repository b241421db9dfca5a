"""One real GRPO step on CPU (`gymserve train`, TRL, the embedded policy) over a stack that mixes a
gymserve environment (`resources/math`) with a NeMo-Gym server hosted unchanged (`nemo_gym/mcqa`,
NeMo-Gym 0.7.0's own mcqa behind our sidecar): both kinds' rewards are in the per-environment series.

The blended dataset of `deploy/train/learn_multi_cpu.yaml` routes its multiple-choice rows to
`mcqa_simple_agent`, which here drives NeMo-Gym's server (the rows carry its `template_metadata`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from services.core.auth import auth_headers
from tests.compat import nemo_gym
from tests.integration._trainer_stack import small_stack

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def head():
    nemo_gym.venv()  # built once and cached; the sidecar reuses it
    servers = [("models/hf", "policy_model", ["accept_weights=true"]), ("resources/math", "math", []),
               ("nemo_gym/mcqa", "mcqa", []),
               ("agents/simple_agent", "math_simple_agent", ["resources_server=math", "model_server=policy_model"]),
               ("agents/simple_agent", "mcqa_simple_agent", ["resources_server=mcqa", "model_server=policy_model"])]
    with small_stack(servers, ready_timeout_s=900) as (head, procs):
        yield head, procs


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_one_grpo_step_over_ours_and_nemo_gyms(head, tmp_path):
    head_proc, procs = head
    ready = httpx.get(f"{procs['mcqa'].url}/ready", headers=auth_headers(), timeout=10).json()
    assert ready["nemo_gym_server"] == "mcqa" and ready["upstream"].startswith("http://127.0.0.1:")
    out = tmp_path / "run"
    # two rows of each environment: the one step's 4 prompts are all of them, so both kinds run in it
    rows = [line for name in ("add_short", "add_mcqa")
            for line in (REPO / "datasets" / name / "train.jsonl").read_text().splitlines()[:2]]
    (tmp_path / "mixed.jsonl").write_text("\n".join(rows) + "\n")
    env = {**os.environ, "GYMSERVE_HEAD_URL": head_proc.url, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "gymserve", "train", "-c", str(REPO / "deploy/train/learn_multi_cpu.yaml"),
                           f"output_dir={out}", "save_final=false", "grpo.max_steps=1",
                           f"train_data=[{tmp_path / 'mixed.jsonl'}]"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    steps = [s for s in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in s]
    assert [s["step"] for s in steps] == [1]
    series = {k: v for k, v in steps[0].items() if k.startswith("reward/")}
    assert set(series) == {"reward/math_simple_agent", "reward/mcqa_simple_agent"}, (steps[0], done.stdout[-3000:])
    assert all(0.0 <= v <= 1.0 for v in series.values()), series
    # the multiple-choice rows were judged by NeMo-Gym's server: its sidecar forwarded them
    metrics = httpx.get(f"{procs['mcqa'].url}/metrics", headers=auth_headers(), timeout=10).text
    assert "verify" in metrics, metrics[-2000:]
