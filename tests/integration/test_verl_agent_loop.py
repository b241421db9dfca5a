"""verl 0.9.1's agent-loop slot with gymserve agents (`trainer/adapters/verl_agent_loop.py`), on CPU:
the loop is built the way verl's `AgentLoopWorker` builds one (the `agent_loop_config_path` entry a user
writes, through `hydra.utils.instantiate`, with verl's own `DictConfigWrap` config; in a Python process
of its own, since hydra and math-verify need different antlr4 versions) and run on real servers behind a head.
A code row goes to `agents/simple_agent` with `models/hf` serving the tiny model taught to call
`execute_python` (a two-call trajectory through the real sandbox): verl gets the stitched token ids,
a response mask with the tool output's tokens at 0, the sampler's logprobs and the environment's
reward, and `AgentLoopOutput.as_dict()` turns it into verl's tensors. A rollout the environment cannot
judge (its judge never gives a verdict) fails the step, or with GYMSERVE_VERL_ON_FAILURE=zero is 0 with
`mask_sample` 1 and nothing trainable. What stays out of reach here: verl's `AgentLoopWorker` itself is a
Ray actor over vLLM/SGLang rollout servers (GPU), so the worker's own scheduling is not run."""
from __future__ import annotations

import json
import os
import subprocess
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


# verl's loop runs in a Python of its own: hydra (which verl imports) needs antlr4 4.9, and math-verify, which
# other tests import into this process, loads antlr4 4.13 first
DRIVER = """
import asyncio, json, os, sys
import hydra
from transformers import AutoTokenizer
from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import DictConfigWrap

spec = json.loads(sys.stdin.read())
config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 1024, "response_length": 256}}, "data": {}})
# the entry a user lists in verl's agent_loop_config_path, instantiated as verl's AgentLoopWorker does it
entry = {"_target_": "trainer.adapters.verl_agent_loop.GymserveAgentLoop"}
loop = hydra.utils.instantiate(config=entry, trainer_config=DictConfigWrap(config=config), server_manager=None,
                               tokenizer=AutoTokenizer.from_pretrained(spec["model"]), processor=None,
                               dataset_cls=None, data_config=DictConfigWrap(config.data))
out = []
for policy, row, params in spec["runs"]:
    os.environ["GYMSERVE_VERL_ON_FAILURE"] = policy
    try:
        output = loop.loop.run_until_complete(loop.run(params, extra_info={"gym_row": row}))
    except Exception as exc:
        out.append({"raised": type(exc).__name__, "message": str(exc)})
        continue
    tensors = output.as_dict()  # verl's own conversion to its tensors
    out.append({"num_turns": output.num_turns, "response_ids": output.response_ids, "mask": output.response_mask,
                "logprobs": output.response_logprobs, "reward": output.reward_score, "extra": output.extra_fields,
                "shapes": [list(tensors[k].shape) for k in ("responses", "response_mask", "rollout_log_probs")],
                "rm_last": float(tensors["rm_scores"][-1])})
print(json.dumps(out))
"""


def run_loops(head_url: str, model: Path, runs: list[tuple[str, dict, dict]]) -> list[dict]:
    """Each (GYMSERVE_VERL_ON_FAILURE, gym row, sampling params) through verl's loop in a fresh Python."""
    env = {**os.environ, "GYMSERVE_HEAD_URL": head_url,
           "PYTHONPATH": os.pathsep.join([str(install(*VERL)), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps({"model": str(model), "runs": runs}),
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


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


def test_a_tool_calling_trajectory_reaches_verl_with_its_mask_logprobs_and_reward(stack):
    head, model = stack
    [output] = run_loops(head.url, model, [("raise", _code_row(), {"temperature": 0.0})])
    assert output["num_turns"] == 4  # user, the execute_python call, its output, the answer
    mask, logprobs = output["mask"], output["logprobs"]
    assert len(output["response_ids"]) == len(mask) == len(logprobs)
    # model tokens (1), then the tool output and template tokens (0), then the answer (1)
    runs = [mask[0]] + [b for a, b in zip(mask, mask[1:]) if a != b]
    assert runs == [1, 0, 1], runs
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if m == 0)
    assert any(lp < 0.0 for lp, m in zip(logprobs, mask) if m == 1)
    assert output["reward"] in (0.0, 1.0)
    assert output["shapes"][0] == output["shapes"][1] == output["shapes"][2] == [len(mask)]
    assert output["rm_last"] == output["reward"]


def test_a_masked_rollout_fails_the_step_or_is_zero_with_nothing_to_train(stack):
    head, model = stack
    row = {"agent_ref": {"name": "equivalence_llm_judge_simple_agent"}, "expected_answer": "Paris",
           "responses_create_params": {"input": [{"role": "user", "content": "Capital of France?"}]}}
    raised, zero, rejected = run_loops(head.url, model, [
        ("raise", row, {}), ("zero", row, {}),
        ("zero", {**row, "expected_answer": None}, {})])  # a row the agent rejects: the dataset's fault
    assert raised["raised"] == "VerifyFailed" and "rollout failed" in raised["message"]
    assert zero["reward"] == 0.0 and zero["extra"]["mask_sample"] == 1
    assert set(zero["mask"]) == {0}
    assert rejected["raised"] == "VerifyFailed" and "bad_request" in rejected["message"]  # even with zero
