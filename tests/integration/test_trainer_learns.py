"""Training through gymserve makes the model better: a shorter `deploy/train/learn_cpu.yaml` run
(SmolLM2-135M on one-digit sums, verified by the math environment, real head/agent/policy
servers) raises the mean reward, and the policy server's `weights_version` follows the
trainer's steps (on-policy weight sync), with near-zero sampler/trainer logprob mismatch. It still
rises with asynchronous rollouts one step off policy (`max_policy_lag: 1`), given more steps."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration._trainer_stack import small_stack
from trainer.config import load_config
from trainer.metrics import MISMATCH_KEYS, exceeding

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
# Thresholds from the observed runs listed in docs/weight-sync.md: in six synchronous runs step 1 (the
# initial policy; the data order is seeded, so the same three prompts every run) scored 0.08 to 0.25,
# and steps 4-6 averaged 0.61 to 0.96. The test asks for less: the last 3 steps at least 0.5 on
# average and at least 0.25 above step 1.
MIN_LAST = 0.5
MIN_RISE = 0.25
# One step off policy, batch s is sampled with the weights of step s - 2, and a batch with few correct
# replies gives GRPO little to learn from, so when the rise starts differs from run to run: in the ten
# lag-1 runs in docs/weight-sync.md the last 3 steps averaged 0.24 to 0.85 after 6 steps (3 under
# MIN_LAST) and 0.64 to 0.92 after 10. So the lag-1 test runs 10 steps, with the same thresholds.
LAG_STEPS = 10


SERVERS = [("models/hf", "policy_model", ["accept_weights=true"]),
           ("resources/math", "math", []),
           ("agents/simple_agent", "math_simple_agent", ["resources_server=math", "model_server=policy_model"])]


def _learn(out: Path, overrides: list[str], steps: int = STEPS) -> tuple[list[dict], list[dict], int, str]:
    """Run learn_cpu for `steps` steps on a fresh stack: (step lines, rollouts, final server version, log)."""
    with small_stack(SERVERS, ready_timeout_s=300) as (head, started):
        policy = started["policy_model"].url
        assert httpx.get(f"{policy}/v1/models", timeout=30).json()["data"][0]["weights_version"] == 0
        env = {**os.environ, "GYMSERVE_HEAD_URL": head.url, "PYTHONUNBUFFERED": "1"}
        result = subprocess.run([sys.executable, "-m", "gymserve", "train", "-c",
                                 str(REPO / "deploy/train/learn_cpu.yaml"), f"output_dir={out}",
                                 f"grpo.max_steps={steps}", "save_final=false", *overrides],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=1100)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        version = httpx.get(f"{policy}/stats", timeout=30).json()["weights_version"]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [s for s in logged if "reward" in s and "loss" in s]
    assert [s["step"] for s in logged] == list(range(1, steps + 1))
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    return logged, rollouts, version, result.stderr


def _assert_learned(steps: list[dict], rollouts: list[dict], out: Path) -> None:
    first = steps[0]["reward"]
    last = sum(s["reward"] for s in steps[-3:]) / 3
    assert last >= MIN_LAST and last - first >= MIN_RISE, (first, last, [s["reward"] for s in steps])
    scored = [r for r in rollouts if r["reward"] == 1.0]
    # answer_format "number": every scored reply states the sum as a number, none merely restates it
    assert scored and all(r["extracted_answer"] == r["expected_answer"] for r in scored), scored[:3]
    assert (out / "reward.png").stat().st_size > 10_000
    report = (out / "report.html").read_text()
    assert "reward by step" in report and "<svg" in report  # the run's report, viewable without a server


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_learn_cpu_reward_rises_and_weights_version_advances(tmp_path):
    out = tmp_path / "run"
    steps, rollouts, version, _ = _learn(out, [])
    # synced before every batch, and once more with the final weights; versions only move forward, so
    # trainer step k is server version k + 1 on a fresh server (at version 0)
    assert version == STEPS + 1
    assert all(s["policy/lag_max"] == 0 for s in steps)  # max_policy_lag 0: strictly on-policy
    assert all(s["policy/logp_delta_mean"] < 0.05 for s in steps), [s["policy/logp_delta_mean"] for s in steps]
    # synced before every batch: NeMo RL's mismatch metrics stay within float noise of perfect agreement
    assert all(set(MISMATCH_KEYS) <= set(s) and not exceeding(s) for s in steps), [exceeding(s) for s in steps]
    batch = load_config(REPO / "deploy/train/learn_cpu.yaml").grpo.trl_options()["per_device_train_batch_size"]
    assert len(rollouts) == STEPS * batch  # every sampled rollout, kept as sampled
    assert {r["policy_version"] for r in rollouts} == set(range(1, STEPS + 1))  # batch k sampled with version k+1
    _assert_learned(steps, rollouts, out)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_learn_cpu_reward_rises_with_policy_lag_1(tmp_path):
    """Asynchronous rollouts: each batch is sampled while the step before it trains (one step off
    policy), with the truncated importance-sampling correction on by default; it still learns."""
    out = tmp_path / "run"
    steps, rollouts, version, log = _learn(out, ["weight_sync.max_policy_lag=1"], LAG_STEPS)
    assert "truncated importance-sampling correction on" in log
    lags = [s["policy/lag_max"] for s in steps]
    assert max(lags) <= 1 and 1 in lags, lags  # it really ran one step off policy, never more
    assert all(set(MISMATCH_KEYS) <= set(s) for s in steps)
    assert version == LAG_STEPS + 1  # weights pushed after every step; the server ends on the final ones
    _assert_learned(steps, rollouts, out)
