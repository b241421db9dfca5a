"""Shortened runs of the CPU training configs of the GRPO guide page, on one stack (real head,
agents, policy server and environments):

- `deploy/train/learn_multi_cpu.yaml` over two environments of different kinds (math and mcqa, one
  blended dataset) with NeMo RL's estimator, a policy lag of 1 (so truncated importance sampling is
  on) and a held-out validation split: metrics.jsonl carries a reward series per environment, NeMo
  RL's mismatch metrics every step and the evaluation reward, and the plot and report draw them;
- `deploy/train/gdpo_cpu.yaml`: GDPO over math_multi_reward's components, each component a series
  of its own in metrics.jsonl and a chart of its own in the report.

The recorded full runs are in docs/grpo-options.md."""
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
ENVS = ("math", "mcqa", "math_multi_reward")


@pytest.fixture(scope="module")
def head():
    servers = [("models/hf", "policy_model", ["accept_weights=true"])]
    servers += [(f"resources/{env}", env, []) for env in ENVS]
    servers += [("agents/simple_agent", f"{env}_simple_agent", [f"resources_server={env}", "model_server=policy_model"])
                for env in ENVS]
    with small_stack(servers, ready_timeout_s=300) as (head, _):
        yield head


def train(head, config: str, out: Path, *overrides: str) -> None:
    env = {**os.environ, "GYMSERVE_HEAD_URL": head.url, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run([sys.executable, "-m", "gymserve", "train", "-c", str(REPO / "deploy/train" / config),
                             f"output_dir={out}", "save_final=false", *overrides],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=1100)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_multi_env_run_logs_per_env_rewards_and_mismatch_metrics(head, tmp_path):
    out = tmp_path / "run"
    train(head, "learn_multi_cpu.yaml", out, f"grpo.max_steps={STEPS}", "weight_sync.max_policy_lag=1",
          "split_validation_size=2", f"grpo.val_period={STEPS}")
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in lines if "reward" in s and "loss" in s]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    for step in steps:
        assert set(MISMATCH_KEYS) <= set(step), step
        assert step["token_mult_prob_error"] >= 1.0 and step["gen_kl_error"] >= 0.0
    seen = {key for s in steps for key in s if key.startswith("reward/")}
    assert seen == {f"reward/{env}_simple_agent" for env in ("math", "mcqa")}, seen  # blended: both environments each run
    evals = [line for line in lines if "eval_reward" in line]
    assert [e["step"] for e in evals] == [STEPS]  # the 2 held-out rows, evaluated every val_period steps
    assert (out / "reward.png").stat().st_size > 10_000
    report = (out / "report.html").read_text()
    assert "reward by environment" in report and "sampler/trainer mismatch" in report and "eval reward" in report


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_gdpo_run_logs_each_reward_component(head, tmp_path):
    out = tmp_path / "run"
    train(head, "gdpo_cpu.yaml", out, "grpo.max_steps=1")
    steps = [s for s in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in s]
    assert [s["step"] for s in steps] == [1]
    parts = [steps[0][f"rewards/reward_{name}/mean"] for name in ("correctness", "integer")]
    assert all(0.0 <= p <= 1.0 for p in parts), steps
    assert steps[0]["reward"] == pytest.approx(sum(parts)), steps  # the components' sum, as the environment scores
    assert (out / "reward.png").stat().st_size > 10_000
    report = (out / "report.html").read_text()
    assert "reward components" in report and "reward_correctness" in report and "reward_integer" in report
