"""A shortened `deploy/train/learn_multi_cpu.yaml` run over two environments of different kinds
(math and mcqa, one blended dataset; real head, agents, policy server and environments) with
NeMo RL's estimator, a policy lag of 1 (so truncated importance sampling is on) and a held-out
validation split: metrics.jsonl carries a reward series per environment, NeMo RL's mismatch
metrics every step and the evaluation reward, and the plot and report draw them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration._trainer_stack import small_stack
from trainer.metrics import MISMATCH_KEYS

REPO = Path(__file__).resolve().parents[2]
STEPS = 2
ENVS = ("math", "mcqa")


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_multi_env_run_logs_per_env_rewards_and_mismatch_metrics(tmp_path):
    servers = [("models/hf", "policy_model", ["accept_weights=true"]), ("resources/math", "math", []),
               ("resources/mcqa", "mcqa", [])]
    servers += [("agents/simple_agent", f"{env}_simple_agent", [f"resources_server={env}", "model_server=policy_model"])
                for env in ENVS]
    out = tmp_path / "run"
    with small_stack(servers, ready_timeout_s=300) as (head, _):
        env = {**os.environ, "GYMSERVE_HEAD_URL": head.url, "PYTHONUNBUFFERED": "1"}
        result = subprocess.run([sys.executable, "-m", "gymserve", "train", "-c",
                                 str(REPO / "deploy/train/learn_multi_cpu.yaml"), f"output_dir={out}",
                                 f"grpo.max_steps={STEPS}", "weight_sync.max_policy_lag=1", "save_final=false",
                                 "split_validation_size=2", f"grpo.val_period={STEPS}"],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=1400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in lines if "reward" in s and "loss" in s]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    for step in steps:
        assert set(MISMATCH_KEYS) <= set(step), step
        assert step["token_mult_prob_error"] >= 1.0 and step["gen_kl_error"] >= 0.0
    seen = {key for s in steps for key in s if key.startswith("reward/")}
    assert seen == {f"reward/{env}_simple_agent" for env in ENVS}, seen  # blended: both environments each run
    evals = [line for line in lines if "eval_reward" in line]
    assert [e["step"] for e in evals] == [STEPS]  # the 2 held-out rows, evaluated every val_period steps
    assert (out / "reward.png").stat().st_size > 10_000
    report = (out / "report.html").read_text()
    assert "reward by environment" in report and "sampler/trainer mismatch" in report and "eval reward" in report
