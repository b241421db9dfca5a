"""verl 0.9.1's agent-loop slot with gymserve agents (`trainer/adapters/verl_agent_loop.py`), on CPU:
the loop is built the way verl's `AgentLoopWorker` builds one (the `agent_loop_config_path` entry a user
writes, through `hydra.utils.instantiate`, with verl's own `DictConfigWrap` config) and run on real servers behind a head.
A code row goes to `agents/simple_agent` with `models/hf` serving the tiny model taught to call
`execute_python` (a two-call trajectory through the real sandbox): verl gets the stitched token ids,
a response mask with the tool output's tokens at 0, the sampler's logprobs and the environment's
reward, and `AgentLoopOutput.as_dict()` turns it into verl's tensors. A rollout the environment cannot
judge (its judge never gives a verdict) fails the step, or with GYMSERVE_VERL_ON_FAILURE=zero is 0 with
`mask_sample` 1 and nothing trainable. What stays out of reach here: verl's `AgentLoopWorker` itself is a
Ray actor over vLLM/SGLang rollout servers (GPU), so the worker's own scheduling is not run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from services.models.hf.tiny import CODE_SYSTEM, EXECUTE_PYTHON, tiny_code_model
from tests.integration._trainer_stack import small_stack
from tests.integration.framework_install import VERL, install

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
# the first code example row (sum_two): the tiny model taught on its messages is cached for test_agents_e2e too
CODE_ROW = json.loads((ROOT / "datasets" / "code" / "example.jsonl").read_text().splitlines()[0])
CODE_ROW_TASK = CODE_ROW["responses_create_params"]["input"]


@pytest.fixture(scope="module")
def verl():
    path = str(install(*VERL))
    sys.path.insert(0, path)
    try:
        import hydra
        from omegaconf import OmegaConf

        from verl.experimental.agent_loop.agent_loop import DictConfigWrap

        def build(tokenizer):
            config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 1024, "response_length": 256}},
                                       "data": {}})
            # the entry a user lists in verl's agent_loop_config_path, as verl's worker instantiates it
            entry = {"_target_": "trainer.adapters.verl_agent_loop.GymserveAgentLoop"}
            return hydra.utils.instantiate(config=entry,
                                           trainer_config=DictConfigWrap(config=config), server_manager=None,
                                           tokenizer=tokenizer, processor=None, dataset_cls=None,
                                           data_config=DictConfigWrap(config.data))
        yield build
    finally:
        sys.path.remove(path)


@pytest.fixture(scope="module")
def stack():
    model = tiny_code_model(CODE_ROW_TASK)
    servers = [("models/hf", "policy_model", [f"model={model}", "max_batch_size=2", "max_model_len=1024"]),
               ("resources/code", "code", []),
               ("agents/simple_agent", "code_simple_agent", ["resources_server=code", "model_server=policy_model",
                                                              "max_output_tokens=64", "max_steps=3"]),
               ("models/stub", "mute_judge", ["text=I cannot decide."]),
               ("resources/equivalence_llm_judge", "equivalence_llm_judge", ["judge_model_server=mute_judge"]),
               ("agents/simple_agent", "equivalence_llm_judge_simple_agent",
                ["resources_server=equivalence_llm_judge", "model_server=policy_model", "max_output_tokens=16"])]
    with small_stack(servers, ready_timeout_s=300) as (head, _):
        yield head, model


def _code_row() -> dict:
    """The row in tool mode, as test_agents_e2e runs it (the system prompt the tiny model was taught with)."""
    params = {**CODE_ROW["responses_create_params"], "tools": [EXECUTE_PYTHON],
              "input": [{"role": "system", "content": CODE_SYSTEM}, *CODE_ROW_TASK]}
    return {**CODE_ROW, "agent_ref": {"name": "code_simple_agent"}, "responses_create_params": params}


def test_a_tool_calling_trajectory_reaches_verl_with_its_mask_logprobs_and_reward(verl, stack, monkeypatch):
    from transformers import AutoTokenizer

    head, model = stack
    monkeypatch.setenv("GYMSERVE_HEAD_URL", head.url)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    loop = verl(tokenizer)
    output = loop.loop.run_until_complete(loop.run({"temperature": 0.0}, extra_info={"gym_row": _code_row()},
                                                   raw_prompt=CODE_ROW_TASK))
    assert output.num_turns == 4  # user, the execute_python call, its output, the answer
    mask = output.response_mask
    assert len(output.response_ids) == len(mask) == len(output.response_logprobs)
    # model tokens (1), then the tool output and template tokens (0), then the answer (1)
    runs = [mask[0]] + [b for a, b in zip(mask, mask[1:]) if a != b]
    assert runs == [1, 0, 1], runs
    assert all(lp == 0.0 for lp, m in zip(output.response_logprobs, mask) if m == 0)
    assert any(lp < 0.0 for lp, m in zip(output.response_logprobs, mask) if m == 1)
    assert output.reward_score in (0.0, 1.0)
    tensors = output.as_dict()  # verl's own conversion: prompts, responses, response_mask, rollout_log_probs, rm_scores
    assert tensors["responses"].shape == tensors["response_mask"].shape == tensors["rollout_log_probs"].shape
    assert float(tensors["rm_scores"][-1]) == output.reward_score


def test_a_masked_rollout_fails_the_step_or_is_zero_with_nothing_to_train(verl, stack, monkeypatch):
    from transformers import AutoTokenizer

    from trainer.adapters.verl import VerifyFailed

    head, model = stack
    monkeypatch.setenv("GYMSERVE_HEAD_URL", head.url)
    loop = verl(AutoTokenizer.from_pretrained(str(model)))
    row = {"agent_ref": {"name": "equivalence_llm_judge_simple_agent"}, "expected_answer": "Paris",
           "responses_create_params": {"input": [{"role": "user", "content": "Capital of France?"}]}}
    monkeypatch.setenv("GYMSERVE_VERL_ON_FAILURE", "raise")
    with pytest.raises(VerifyFailed, match="rollout failed"):
        loop.loop.run_until_complete(loop.run({}, extra_info={"gym_row": row}))
    monkeypatch.setenv("GYMSERVE_VERL_ON_FAILURE", "zero")
    output = loop.loop.run_until_complete(loop.run({}, extra_info={"gym_row": row}))
    assert output.reward_score == 0.0 and output.extra_fields["mask_sample"] == 1
    assert set(output.response_mask) == {0}
    # a row the agent rejects is the dataset's fault: it raises even with zero
    with pytest.raises(VerifyFailed, match="bad_request"):
        loop.loop.run_until_complete(loop.run({}, extra_info={"gym_row": {**row, "expected_answer": None}}))
