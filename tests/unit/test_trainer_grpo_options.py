"""GRPO options: the estimators on golden vectors worked by hand, NeMo RL's mismatch metrics,
truncated importance-sampling weights, and the config keys named after NeMo RL's options."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from trainer.advantages import compute_advantages
from trainer.config import TrainConfigError, load_config
from trainer.metrics import MISMATCH_KEYS, deviations, exceeding, importance_weights, mismatch_metrics

THIRD = 1 / 3


def test_estimators_on_a_group_with_one_success():
    """Group [1, 0, 0, 0]. TRL: mean 0.25, Bessel std 0.5 -> [1.5, -0.5, -0.5, -0.5].
    Leave-one-out: the success's baseline is the others' mean 0 (std 0: not divided) -> 1; each
    failure's baseline is mean(1, 0, 0) = 1/3, Bessel std of (1, 0, 0) = sqrt(1/3) -> -1/3 / sqrt(1/3)."""
    rewards, groups = [1.0, 0.0, 0.0, 0.0], [0, 0, 0, 0]
    nemo = compute_advantages("nemo_rl_grpo", rewards, groups)
    np.testing.assert_allclose(nemo, [1.0, -math.sqrt(THIRD), -math.sqrt(THIRD), -math.sqrt(THIRD)], rtol=1e-5)
    rloo = compute_advantages("leave_one_out", rewards, groups)
    np.testing.assert_allclose(rloo, [1.0, -THIRD, -THIRD, -THIRD])


def test_estimators_keep_groups_apart_and_zero_unscorable_samples():
    """[1, 0, nan, 0 | 2, 2]: the NaN (no reward function could score it) gets 0 and stays out of its
    group's baseline, so group 0 is [1, 0, 0]: the success gets 1 - mean(0, 0) = 1, a failure
    0 - mean(1, 0) = -0.5 divided by std(1, 0) = sqrt(0.5). Group 1 has equal rewards: 0."""
    rewards = [1.0, 0.0, math.nan, 0.0, 2.0, 2.0]
    groups = [0, 0, 0, 0, 1, 1]
    nemo = compute_advantages("nemo_rl_grpo", rewards, groups)
    np.testing.assert_allclose(nemo, [1.0, -0.5 / math.sqrt(0.5), 0.0, -0.5 / math.sqrt(0.5), 0.0, 0.0],
                               rtol=1e-5)
    np.testing.assert_allclose(compute_advantages("leave_one_out", rewards, groups), [1.0, -0.5, 0.0, -0.5, 0, 0])


def test_gdpo_golden_vector():
    """a = [1,0 | 1,0] normalizes to +-sqrt(1/2) per group; b = [1,1 | 0,0] has zero std: 0.
    The sum [s, -s, s, -s] (s = sqrt(1/2)) over the batch: mean 0, Bessel std sqrt(2/3) -> +-sqrt(3)/2."""
    adv = compute_advantages("gdpo", [0.0] * 4, [0, 0, 1, 1],
                             components={"reward_a": [1, 0, 1, 0], "reward_b": [1, 1, 0, 0]})
    np.testing.assert_allclose(adv, [math.sqrt(3) / 2, -math.sqrt(3) / 2] * 2, rtol=1e-5)
    with pytest.raises(ValueError, match="components"):
        compute_advantages("gdpo", [1.0, 0.0], [0, 0])
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_advantages("ppo", [1.0, 0.0], [0, 0])


def test_mismatch_metrics_on_one_token():
    """Trainer p = 0.5, sampler p = 0.25: exp|Δ| = 2; k3 KLs with log-ratio +-log 2;
    JS through the mixture 0.375; the importance ratio 2, truncated to the cap."""
    import torch

    trainer = torch.tensor([[math.log(0.5), 0.0]])
    sampler = torch.tensor([[math.log(0.25), -9.0]])
    mask = torch.tensor([[1, 0]])  # the second token is padding: ignored
    m = mismatch_metrics(trainer, sampler, mask)
    assert m["token_mult_prob_error"] == pytest.approx(2.0)
    assert m["gen_kl_error"] == pytest.approx(1 - math.log(2))
    assert m["policy_kl_error"] == pytest.approx(math.log(2) - 0.5)
    js = 0.5 * (4 / 3 - math.log(4 / 3) - 1) + 0.5 * (2 / 3 - math.log(2 / 3) - 1)
    assert m["js_divergence_error"] == pytest.approx(js)
    assert m["sampling_importance_ratio"] == pytest.approx(2.0)
    assert mismatch_metrics(trainer, sampler, mask, cap=1.5)["sampling_importance_ratio"] == pytest.approx(1.5)
    assert set(exceeding(m)) == set(MISMATCH_KEYS)


def test_identical_logprobs_are_perfect_agreement_and_unknown_tokens_are_skipped():
    import torch

    lp = torch.tensor([[-0.3, -1.2, -2.0]])
    sampler = torch.tensor([[-0.3, -1.2, math.nan]])
    m = mismatch_metrics(lp, sampler, torch.ones_like(lp))
    assert set(m) == set(MISMATCH_KEYS)
    assert max(deviations(m).values()) < 1e-6 and exceeding(m) == {}
    assert mismatch_metrics(lp, torch.full_like(lp, math.nan), torch.ones_like(lp)) == {}


def test_importance_weights_truncate_and_leave_unknown_tokens_alone():
    import torch

    trainer = torch.tensor([[-0.1, -0.1, -0.1, -0.1]])
    sampler = torch.tensor([[-0.1, -2.1, 0.0, math.nan]])
    w = importance_weights(trainer, sampler, torch.tensor([[1, 1, 1, 1]]), cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, math.exp(-0.1), 1.0]]))


def _config(tmp_path, text: str, overrides: list[str] | None = None):
    path = tmp_path / "t.yaml"
    path.write_text("output_dir: out\ntrain_data: rows.jsonl\n" + text)
    return load_config(path, overrides)


def test_guide_option_names_map_to_trl(tmp_path):
    config = _config(tmp_path, "grpo: {overlong_filtering: true, ratio_clip_c: 3.0, use_on_policy_kl_approximation: "
                               "true, beta: 0.04}\n")
    assert config.grpo.trl_options() == {"mask_truncated_completions": True, "delta": 3.0,
                                         "use_bias_correction_kl": True, "beta": 0.04}
    assert config.grpo.advantage == "trl" and not config.importance_sampling()


@pytest.mark.parametrize("override, field", [
    ("grpo.advantage=ppo", "advantage"),
    ("grpo.ratio_clip_c=1.0", "ratio_clip_c"),
    ("grpo.mask_truncated_completions=true", "overlong_filtering"),
    ("grpo.truncated_importance_sampling_ratio=0", "truncated_importance_sampling_ratio"),
    ("grpo.advantage=gdpo", "reward_components"),
    ("rollout.concurrency=0", "concurrency"),
])
def test_bad_grpo_options_name_the_key(tmp_path, override, field):
    with pytest.raises(TrainConfigError, match=field):
        _config(tmp_path, "grpo: {overlong_filtering: false}\n", [override])


def test_importance_sampling_defaults_on_with_policy_lag(tmp_path):
    assert _config(tmp_path, "weight_sync: {max_policy_lag: 1}\n").importance_sampling()
    assert not _config(tmp_path, "weight_sync: {max_policy_lag: 1}\n",
                       ["grpo.use_importance_sampling_correction=false"]).importance_sampling()
    assert _config(tmp_path, "", ["grpo.use_importance_sampling_correction=true"]).importance_sampling()
    config = _config(tmp_path, "reward_components: [a, b]\n", ["grpo.advantage=gdpo"])
    assert config.grpo.advantage == "gdpo" and "advantage" not in config.grpo.trl_options()


def test_split_validation_holds_out_seeded_rows(tmp_path):
    import json

    from trainer.data import load_rows, split_validation

    rows = [{"agent_ref": {"name": "a" if i % 2 else "b"}, "i": i} for i in range(20)]
    train, held = split_validation(rows, 0.1, seed=0)
    assert len(held) == 2 and len(train) == 18 and not {r["i"] for r in held} & {r["i"] for r in train}
    assert split_validation(rows, 0.1, seed=0) == (train, held)  # seeded
    assert len(split_validation(rows, 5, seed=1)[1]) == 5
    with pytest.raises(TrainConfigError, match="no training rows"):
        split_validation(rows, 20, seed=0)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = _config(tmp_path, "split_validation_size: 4\n", ["grpo.val_period=3"])  # rows.jsonl: next to it
    train, held = load_rows(config)
    assert len(train) == 16 and len(held) == 4
    assert config.grpo.trl_options() == {"eval_strategy": "steps", "eval_steps": 3}
    with pytest.raises(TrainConfigError, match="split_validation_size"):
        _config(tmp_path, "", ["split_validation_size=2.5"])


@pytest.mark.parametrize("name", sorted(p.name for p in (Path(__file__).resolve().parents[2] / "deploy/train").glob("*.yaml")))
def test_shipped_training_configs_load(name):
    from trainer.config import grpo_args

    config = load_config(Path(__file__).resolve().parents[2] / "deploy/train" / name)
    assert grpo_args(config).max_steps > 0
    if name == "learn_multi_cpu.yaml":  # two environments of different kinds, NeMo RL's estimator
        assert len(config.train_data) == 2 and config.grpo.advantage == "nemo_rl_grpo"


def test_num_prompts_per_dataset_fixes_each_steps_mix(tmp_path):
    import json

    from trainer.config import grpo_args
    from trainer.data import load_rows, quota_order

    for name, agent, count in (("a.jsonl", "math", 6), ("b.jsonl", "mcqa", 2)):
        (tmp_path / name).write_text("".join(json.dumps({"agent_ref": {"name": agent}, "i": i}) + "\n"
                                             for i in range(count)))
    quotas = "train_data: [a.jsonl, b.jsonl]\nnum_prompts_per_dataset: [3, 1]\n"
    text = f"output_dir: out\n{quotas}grpo: {{num_generations: 2, per_device_train_batch_size: 8}}\n"
    (tmp_path / "q.yaml").write_text(text)
    config = load_config(tmp_path / "q.yaml")
    rows, _ = load_rows(config)
    steps = [rows[k:k + 4] for k in range(0, len(rows), 4)]
    assert len(steps) == 2  # file a needs 6 / 3 steps; file b (2 rows, 1 a step) is cycled as needed
    for step in steps:
        assert [r["agent_ref"]["name"] for r in step] == ["math"] * 3 + ["mcqa"]
    assert sorted(r["i"] for r in rows if r["agent_ref"]["name"] == "math") == list(range(6))  # each row once
    assert quota_order([[{"i": 0}], [{"j": 0}, {"j": 1}, {"j": 2}]], [1, 2], seed=0)[:3][0] == {"i": 0}
    args = grpo_args(config)
    assert args.shuffle_dataset is False  # TRL's sampler keeps the per-step layout
    with pytest.raises(TrainConfigError, match="num_prompts_per_dataset adds up to 4 prompts, but a step takes 2"):
        grpo_args(load_config(tmp_path / "q.yaml", ["grpo.per_device_train_batch_size=4"]))
    with pytest.raises(TrainConfigError, match="num_prompts_per_dataset"):
        load_config(tmp_path / "q.yaml", ["num_prompts_per_dataset=[4]"])
    with pytest.raises(TrainConfigError, match="num_prompts_per_dataset"):
        load_config(tmp_path / "q.yaml", ["num_prompts_per_dataset=[4, 0]"])
