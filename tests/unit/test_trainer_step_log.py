"""Per-step records, policy versions and lag, the |Δlogp| metric, and weight_sync config checks."""
from __future__ import annotations

import json
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from trainer.grpo import logp_delta
from trainer.step_log import StepLog, describe, plot, read_metrics
from trainer.tokens import policy_version
from trainer.config import TrainConfigError, load_config
from trainer.weight_sync import PolicyHooks, WeightSync


def test_every_record_goes_to_metrics_jsonl_and_plots(tmp_path) -> None:
    log = StepLog(tmp_path, total=3, progress=False)
    for step in (1, 2, 3):
        log.record(step, {"loss": 0.1, "reward": 0.2 * step, "reward_std": 0.1, "kl": 0.01 * step,
                          "rewards/env_reward/mean": 0.2 * step, "policy/logp_delta_mean": 1e-4,
                          "policy/logp_delta_max": 1e-3, "nan": float("nan")})
    log.record(3, {"train_runtime": 12.0})  # the final summary line has no reward
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and lines[0]["step"] == 1 and lines[0]["nan"] is None
    assert [r["reward"] for r in read_metrics(tmp_path / "metrics.jsonl")] == pytest.approx([0.2, 0.4, 0.6])
    png = plot(tmp_path / "metrics.jsonl", tmp_path / "reward.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert describe(lines[1]).startswith("reward 0.400")


def test_rollout_policy_version_is_the_oldest_model_call() -> None:
    call = {"prompt_token_ids": [1], "generation_token_ids": [2], "generation_log_probs": [-0.1]}
    response = {"output": [{**call, "policy_version": 4}, {"type": "function_call_output"},
                           {**call, "policy_version": 5}]}
    assert policy_version(response) == 4
    assert policy_version({"output": [call]}) is None
    assert policy_version(None) is None


def test_logp_delta_ignores_masked_and_unknown_tokens() -> None:
    ours = torch.tensor([[-1.0, -2.0, -3.0]])
    theirs = torch.tensor([[-1.5, float("nan"), -9.0]])
    mask = torch.tensor([[1, 1, 0]])
    assert logp_delta(ours, theirs, mask) == pytest.approx((0.5, 0.5))
    assert logp_delta(ours, theirs, torch.zeros_like(mask)) is None


def test_policy_hooks_log_lag_per_batch() -> None:
    trainer = SimpleNamespace(model=SimpleNamespace(training=True), state=SimpleNamespace(global_step=6),
                              _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    PolicyHooks(None).after_batch(trainer, [{"policy_version": 6}, {"policy_version": 4}, {"reward": None}])
    metrics = trainer._metrics["train"]
    assert metrics["policy/lag_max"] == [2.0] and metrics["policy/lag_mean"] == [1.0]
    assert metrics["policy/weights_version"] == [4.0]


def test_sync_decision_follows_max_policy_lag() -> None:
    pushed: list[int] = []
    sync = WeightSync("http://127.0.0.1:9", max_policy_lag=2)
    sync.push = lambda model, version: (pushed.append(version), setattr(sync, "server_version", version))  # type: ignore
    for step in range(8):
        sync.before_rollout(None, step)
    assert pushed == [0, 3, 6]  # first batch, then whenever the lag would exceed 2
    with pytest.raises(ValueError):
        WeightSync("http://x", max_policy_lag=-1)


@pytest.mark.parametrize("override, field", [
    ("weight_sync.max_policy_lag=-1", "max_policy_lag"),
    ("weight_sync.max_policy_lag=1.5", "max_policy_lag"),
    ("weight_sync.enabled=maybe", "enabled"),
    ("weight_sync.every=2", "every"),
])
def test_weight_sync_config_errors_name_the_key(tmp_path, override, field) -> None:
    config = tmp_path / "train.yaml"
    config.write_text("output_dir: out\ntrain_data: rows.jsonl\n")
    with pytest.raises(TrainConfigError, match=field):
        load_config(config, [override])
    assert load_config(config, ["weight_sync.max_policy_lag=2"]).weight_sync.max_policy_lag == 2
