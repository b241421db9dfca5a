"""verl 0.9.1's own reward path with our `compute_score`: loaded by verl's `get_custom_reward_fn`
(`pkg://trainer.adapters.verl`), called by verl's `naive` and `gdpo` reward managers on a
DataProto, against real resource servers (exact_match, math_multi_reward) behind a head. verl is
installed with `--no-deps` into a cache outside the repository (tests/integration/framework_install.py)."""
from __future__ import annotations

import sys

import pytest
import torch

from tests.integration._trainer_stack import small_stack
from tests.integration.framework_install import VERL, install

ANSWER_42 = "<think>\nadd\n</think>\n<answer>\n42\n</answer>"  # math_multi_reward: every component 1


@pytest.fixture(scope="module")
def verl():
    path = str(install(*VERL))
    sys.path.insert(0, path)
    try:
        from omegaconf import OmegaConf

        from verl.experimental.reward_loop.reward_manager.gdpo import GDPORewardManager
        from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager
        from verl.trainer.ppo.reward import get_custom_reward_fn

        config = OmegaConf.create({"trainer": {"experiment_name": "gymserve"}, "reward": {"custom_reward_function": {
            "path": "pkg://trainer.adapters.verl", "name": "compute_score"}}})
        yield {"compute_score": get_custom_reward_fn(config), "naive": NaiveRewardManager,
               "gdpo": GDPORewardManager, "config": config}
    finally:
        sys.path.remove(path)


@pytest.fixture(scope="module")
def stack():
    with small_stack([("resources/exact_match", "exact_match", []),
                      ("resources/math_multi_reward", "math_multi_reward", []),
                      # a judged environment whose judge never gives a verdict: every sample is masked
                      ("models/stub", "mute_judge", ["text=I cannot decide."]),
                      ("resources/equivalence_llm_judge", "equivalence_llm_judge",
                       ["judge_model_server=mute_judge"])]) as (head, procs):
        yield head, procs


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from services.models.hf.embedded import embedded_model_dir

    return AutoTokenizer.from_pretrained(embedded_model_dir())


def _score(verl, kind: str, tokenizer, data_source: str, answer: str, ground_truth) -> dict:
    from verl import DataProto

    prompt = tokenizer("Question: ", add_special_tokens=False, return_tensors="pt")["input_ids"]
    response = tokenizer(answer, add_special_tokens=False, return_tensors="pt")["input_ids"]
    data = DataProto.from_dict(
        tensors={"prompts": prompt, "responses": response,
                 "attention_mask": torch.ones(1, prompt.shape[1] + response.shape[1], dtype=torch.long)},
        non_tensors={"data_source": [data_source], "reward_model": [{"ground_truth": ground_truth}],
                     "extra_info": [{"question": "Question: "}]})
    manager = verl[kind](verl["config"], tokenizer, verl["compute_score"])
    return manager.loop.run_until_complete(manager.run_single(data))


def test_naive_reward_manager_scores_with_our_environment(verl, stack, tokenizer, monkeypatch):
    head, _ = stack
    monkeypatch.setenv("GYMSERVE_HEAD_URL", head.url)
    assert _score(verl, "naive", tokenizer, "exact_match", "Paris", "Paris")["reward_score"] == 1.0
    assert _score(verl, "naive", tokenizer, "exact_match", "Rome", "Paris")["reward_score"] == 0.0


def test_gdpo_reward_manager_gets_the_components(verl, stack, tokenizer, monkeypatch):
    head, _ = stack
    monkeypatch.setenv("GYMSERVE_HEAD_URL", head.url)
    result = _score(verl, "gdpo", tokenizer, "math_multi_reward", ANSWER_42, "42")
    assert result["reward_score"] == pytest.approx(3.0)
    assert {"correctness", "integer", "format"} <= set(result["reward_extra_info"])
    assert result["reward_extra_info"]["correctness"] == 1.0


def test_unverifiable_sample_fails_verls_reward_step(verl, stack, tokenizer, monkeypatch):
    """verl has no per-sample mask: what compute_score raises leaves verl's reward manager, so the step
    fails loudly instead of training on a made-up 0 (a rejected row raises even with
    GYMSERVE_VERL_ON_FAILURE=zero, which only turns masked infrastructure failures into 0)."""
    head, _ = stack
    monkeypatch.setenv("GYMSERVE_HEAD_URL", head.url)
    for policy in ("raise", "zero"):
        monkeypatch.setenv("GYMSERVE_VERL_ON_FAILURE", policy)
        with pytest.raises(Exception, match="expected_answer"):
            _score(verl, "naive", tokenizer, "exact_match", "Paris", {"no_expected_answer": 1})


def test_a_masked_sample_reaches_verl_as_zero_with_its_mask_or_fails_the_step(verl, stack, tokenizer, monkeypatch):
    """A sample the environment could not judge (its judge's reply holds no verdict: masked) through verl's own
    naive reward manager: with GYMSERVE_VERL_ON_FAILURE=zero, score 0.0 and `mask_sample` 1 in verl's
    reward_extra_info (verl has no per-sample mask; a user filters on it); by default the step raises."""
    head, _ = stack
    monkeypatch.setenv("GYMSERVE_HEAD_URL", head.url)
    monkeypatch.setenv("GYMSERVE_VERL_ON_FAILURE", "zero")
    result = _score(verl, "naive", tokenizer, "equivalence_llm_judge", "Paris", "Paris")
    assert result["reward_score"] == 0.0 and result["reward_extra_info"]["mask_sample"] == 1, result
    monkeypatch.setenv("GYMSERVE_VERL_ON_FAILURE", "raise")
    with pytest.raises(Exception, match="verification failed"):
        _score(verl, "naive", tokenizer, "equivalence_llm_judge", "Paris", "Paris")
