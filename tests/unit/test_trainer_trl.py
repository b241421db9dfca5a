"""Token stitching, TRL rollout outputs, masking of failed rollouts, reward functions, train config."""
from __future__ import annotations

import json

import pytest

from trainer.tokens import StitchError, stitch
from trainer.trl import RowIndex, reward_functions, rollout_outputs, row_prompt, to_trl_dataset
from trainer.config import TrainConfigError, load_config


class Tok:
    """Tokenizer stand-in: only ids are needed for a masked sample (ids never reach a model here)."""

    eos_token_id = 2
    pad_token_id = 0

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [1] + [len(m["content"]) for m in messages]


def _call(prompt, gen, logps=None, **extra):
    return {"type": "message", "role": "assistant", "content": [], "prompt_token_ids": prompt,
            "generation_token_ids": gen, "generation_log_probs": logps or [-0.5] * len(gen), **extra}


def test_stitch_multi_turn_masks_tool_tokens():
    response = {"output": [
        {"type": "reasoning", "summary": []},
        _call([1, 2, 3], [10, 11], [-0.1, -0.2]),            # call 1 (a function_call item in real life)
        {"type": "function_call_output", "call_id": "c", "output": "42"},
        _call([1, 2, 3, 10, 11, 20, 21], [12, 2], [-0.3, -0.4]),  # call 2: tool tokens 20, 21 then generation
    ]}
    s = stitch(response)
    assert s.prompt_ids == [1, 2, 3]
    assert s.completion_ids == [10, 11, 20, 21, 12, 2]
    assert s.env_mask == [1, 1, 0, 0, 1, 1]
    assert s.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3, -0.4]
    assert s.num_calls == 2


def test_stitch_rejects_broken_continuity_and_missing_tokens():
    with pytest.raises(StitchError, match="continuity"):
        stitch({"output": [_call([1, 2], [3]), _call([1, 9, 3, 4], [5])]})
    with pytest.raises(StitchError, match="token_continuity_broken"):
        stitch({"output": [_call([1, 2], [3]), _call([1, 2, 3, 4], [5], token_continuity_broken=True)]})
    with pytest.raises(StitchError, match="training mode"):
        stitch({"output": [{"type": "message", "role": "assistant", "content": "hi"}]})
    with pytest.raises(StitchError, match="logprobs"):
        stitch({"output": [_call([1], [3, 4], [-1.0])]})


def test_rollout_outputs_mask_failures_and_keep_order():
    ok = {"reward": 1.5, "reward_components": {"a": 1.0, "b": 0.5}, "num_turns": 1,
          "response": {"output": [_call([1, 2], [7, 2])]}}
    failed = {"reward": None, "mask_sample": True, "failure_kind": "timeout", "failure_reason": "slow"}
    broken = {"reward": 1.0, "response": {"output": [{"type": "message", "role": "assistant", "content": "x"}]}}
    prompts = [[{"role": "user", "content": "hi"}]] * 3
    out = rollout_outputs(prompts, [ok, failed, broken], Tok())
    assert out["completion_ids"] == [[7, 2], [2], [2]]
    assert out["env_mask"] == [[1, 1], [0], [0]]
    assert out["logprobs"][1] == [0.0]
    assert out["prompt_ids"][1] == [1, 2]  # fallback prompt ids from the chat template
    assert out["env_reward"] == [1.5, None, None]  # failed -> None (NaN in TRL), never 0
    assert out["reward_a"] == [1.0, None, None] and out["reward_b"] == [0.5, None, None]
    assert out["gymserve_failure"] == [None, "timeout", "upstream"]
    assert "training mode" in out["gymserve_failure_reason"][2]
    assert out["num_turns"] == [1, 0, 0]


def test_reward_functions_total_and_components():
    total, = reward_functions()
    assert total(completions=[1, 2], env_reward=[0.5, None]) == [0.5, None]
    funcs = reward_functions(["format", "correct"])
    assert [f.__name__ for f in funcs] == ["reward_format", "reward_correct"]
    assert funcs[1](completions=[1, 2], reward_correct=[1.0, 0.0]) == [1.0, 0.0]
    assert funcs[0](completions=[1, 2]) == [None, None]
    assert [f.__name__ for f in reward_functions(["x"], include_total=True)] == ["env_reward", "reward_x"]


def test_row_index_maps_prompts_back_to_rows():
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": "q1"}]}, "agent_ref": {"name": "a"}},
            {"responses_create_params": {"input": "q2"}, "agent_ref": {"name": "b"}, "expected_answer": "x"}]
    ds = to_trl_dataset(rows)
    index = RowIndex()
    index.add_dataset(ds)
    assert len(index) == 2
    assert index.get(ds[1]["prompt"])["expected_answer"] == "x"
    assert index.get(row_prompt(rows[0]))["agent_ref"]["name"] == "a"
    assert index.get([{"role": "user", "content": "other"}]) is None
    assert json.loads(ds[0]["gymserve_row"]) == rows[0]


def test_train_config_errors(tmp_path):
    cfg = tmp_path / "t.yaml"
    cfg.write_text("output_dir: x\ntrain_data: a.jsonl\nbogus: 1\n")
    with pytest.raises(TrainConfigError, match="bogus"):
        load_config(cfg)
    cfg.write_text("output_dir: x\ntrain_data: a.jsonl\nhead_url: ${NOT_SET_ANYWHERE_X}\ngrpo: {max_steps: 1}\n")
    config = load_config(cfg, ["grpo.max_steps=3", "rollout.concurrency=2"])
    assert config.head_url is None and config.grpo.trl_options()["max_steps"] == 3
    assert config.rollout.model_dump(exclude_unset=True) == {"concurrency": 2}
    with pytest.raises(TrainConfigError, match="rollout"):
        load_config(cfg, ["rollout.nope=1"])


def test_exponent_floats_are_numbers_in_files_and_overrides(tmp_path):
    """`1e-4` is a float (PyYAML alone reads it as a string, which crashed deep inside torch's optimizer)."""
    cfg = tmp_path / "t.yaml"
    cfg.write_text("output_dir: x\ntrain_data: a.jsonl\ngrpo: {learning_rate: 1e-4, beta: '1e-3'}\n")
    assert load_config(cfg).grpo.trl_options() == {"learning_rate": 1e-4, "beta": "1e-3"}  # quoted stays a string
    assert load_config(cfg, ["grpo.learning_rate=2e-5"]).grpo.trl_options()["learning_rate"] == 2e-5


def test_train_rejects_rows_without_agent_ref(tmp_path):
    from trainer.train import build_trainer

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"responses_create_params": {"input": "hi"}}) + "\n")
    cfg = tmp_path / "t.yaml"
    cfg.write_text(f"output_dir: {tmp_path / 'out'}\ntrain_data: {data}\n")
    with pytest.raises(TrainConfigError, match="agent_ref"):
        build_trainer(load_config(cfg))
