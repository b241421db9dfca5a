"""OpenRLHF 0.11.2's own remote reward client (`SingleTurnAgentExecutor` with `--remote_rm_url`)
against the head's `/get_reward`, and its samples generator's conversion of the reply into an
Experience. vLLM cannot run here: the engine is a stand-in that returns fixed tokens, and the
`vllm` module the samples generator imports is a stub (only `SamplingParams` is named)."""
from __future__ import annotations

import asyncio
import sys
import types
from types import SimpleNamespace

import pytest

from tests.integration.framework_install import OPENRLHF, install


@pytest.fixture(scope="module")
def openrlhf():
    path = str(install(*OPENRLHF))
    sys.path.insert(0, path)
    stubs = {"vllm": types.ModuleType("vllm"), "openrlhf.trainer.ray.vllm_engine": types.ModuleType("vllm_engine")}
    stubs["vllm"].SamplingParams = object  # type: ignore[attr-defined]
    stubs["openrlhf.trainer.ray.vllm_engine"].batch_vllm_engine_call = None  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in stubs}
    sys.modules.update(stubs)
    try:
        from openrlhf.trainer.ppo_utils import samples_generator
        from openrlhf.utils import agent

        yield agent, samples_generator
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        sys.path.remove(path)


@pytest.fixture(scope="module")
def head():
    from gymserve.testing import ServerProcess
    from tests.integration._trainer_stack import wait_registered

    with ServerProcess("head", "openrlhf_environment=exact_match") as head:
        with ServerProcess("resources/exact_match", name="exact_match", env={"GYMSERVE_HEAD_URL": head.url}):
            wait_registered(head.url, ["exact_match"])
            yield head


class _Engine:
    """Stands in for OpenRLHF's vLLM engine: answers every prompt with the same tokens."""

    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids = token_ids

    async def generate(self, prompt_token_ids, params, multi_modal_data=None):
        out = SimpleNamespace(token_ids=self.token_ids, finish_reason="stop", logprobs=None)
        return SimpleNamespace(outputs=[out])


def _run(agent, head_url: str, answer: str, label: str) -> dict:
    from transformers import AutoTokenizer

    from services.models.hf.embedded import embedded_model_dir

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    executor = agent.SingleTurnAgentExecutor(remote_rm_url=f"{head_url}/get_reward")
    params = SimpleNamespace(max_tokens=16, logprobs=None)
    engine = _Engine(tokenizer(answer, add_special_tokens=False)["input_ids"])
    return asyncio.run(executor.execute("Capital of France? Answer: ", label, params, 64, tokenizer, engine))


def test_openrlhf_client_gets_our_rewards(openrlhf, head):
    agent, samples_generator = openrlhf
    right = _run(agent, head.url, "Paris", "Paris")
    wrong = _run(agent, head.url, "Rome", "Paris")
    assert right["reward"] == [1.0] and right["scores"] == [1.0]
    assert wrong["reward"] == [0.0] and right["extra_logs"]["mask_sample"] == [False]
    experience = samples_generator.SamplesGenerator._process_response_into_experience(None, right, max_len=64)
    assert experience.rewards.flatten().tolist() == [1.0]
    assert experience.info["mask_sample"].flatten().tolist() == [False]


def test_openrlhf_masked_failure_is_flagged_in_its_metrics(openrlhf, head):
    """OpenRLHF cannot drop a sample: the masked one scores 0 and carries mask_sample 1, which OpenRLHF
    logs per sample (Experience.info) so every such 0 is counted."""
    agent, samples_generator = openrlhf
    masked = _run(agent, head.url, "Paris", '{"no_expected_answer": 1}')
    assert masked["reward"] == [0.0] and masked["extra_logs"]["mask_sample"] == [True]
    experience = samples_generator.SamplesGenerator._process_response_into_experience(None, masked, max_len=64)
    assert experience.info["mask_sample"].flatten().tolist() == [True]
    assert experience.info["num_masked"].flatten().tolist() == [1]
