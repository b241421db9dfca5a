"""OpenRLHF 0.11.2's own remote reward client (`SingleTurnAgentExecutor` with `--remote_rm_url`)
against the head's `/get_reward`, and its samples generator's conversion of the reply into an
Experience; and, against a head that enforces its key, that client given our reward file
(`trainer/adapters/openrlhf_reward.py`) instead of the URL. vLLM cannot run here: the engine is
a stand-in that returns fixed tokens, and the `vllm` module the samples generator imports is a
stub (only `SamplingParams` is named)."""
from __future__ import annotations

import asyncio
import logging
import socket
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import httpx
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


def _run(agent, remote_rm_url: str, answer: str, label: str) -> dict:
    from transformers import AutoTokenizer

    from services.models.hf.embedded import embedded_model_dir

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    executor = agent.SingleTurnAgentExecutor(remote_rm_url=remote_rm_url)
    params = SimpleNamespace(max_tokens=16, logprobs=None)
    engine = _Engine(tokenizer(answer, add_special_tokens=False)["input_ids"])
    return asyncio.run(executor.execute("Capital of France? Answer: ", label, params, 64, tokenizer, engine))


def test_openrlhf_client_gets_our_rewards(openrlhf, head):
    agent, samples_generator = openrlhf
    right = _run(agent, f"{head.url}/get_reward", "Paris", "Paris")
    wrong = _run(agent, f"{head.url}/get_reward", "Rome", "Paris")
    assert right["reward"] == [1.0] and right["scores"] == [1.0]
    assert wrong["reward"] == [0.0] and right["extra_logs"]["mask_sample"] == [False]
    experience = samples_generator.SamplesGenerator._process_response_into_experience(None, right, max_len=64)
    assert experience.rewards.flatten().tolist() == [1.0]
    assert experience.info["mask_sample"].flatten().tolist() == [False]


def test_openrlhf_masked_failure_is_flagged_in_its_metrics(openrlhf, head):
    """OpenRLHF cannot drop a sample: the masked one scores 0 and carries mask_sample 1, which OpenRLHF
    logs per sample (Experience.info) so every such 0 is counted."""
    agent, samples_generator = openrlhf
    masked = _run(agent, f"{head.url}/get_reward", "Paris", '{"no_expected_answer": 1}')
    assert masked["reward"] == [0.0] and masked["extra_logs"]["mask_sample"] == [True]
    experience = samples_generator.SamplesGenerator._process_response_into_experience(None, masked, max_len=64)
    assert experience.info["mask_sample"].flatten().tolist() == [True]
    assert experience.info["num_masked"].flatten().tolist() == [1]


KEY = "openrlhf-key-test-7c41"
KEYED_STACK = """
head: {host: 127.0.0.1, port: 0, openrlhf_environment: exact_match}
servers:
  exact_match: {kind: resources/exact_match}
"""
REWARD_FILE = str(Path(__file__).resolve().parents[2] / "trainer" / "adapters" / "openrlhf_reward.py")


@pytest.fixture(scope="module")
def keyed_head(tmp_path_factory):
    """A `gymserve up` stack that enforces its key, as every stack does."""
    from tests.integration.up_helpers import Up

    path = tmp_path_factory.mktemp("openrlhf-keyed") / "stack.yaml"
    path.write_text(KEYED_STACK)
    up = Up("-c", str(path), env={"GYMSERVE_API_KEY": KEY})
    try:
        up.wait_for(r"all \d+ servers ready", timeout_s=120)
        yield up.wait_for(r"head on (http://\S+)").group(1)
    finally:
        up.kill()


def test_openrlhf_http_client_is_refused_by_a_keyed_head(openrlhf, keyed_head):
    """Why `--remote_rm_url` must name our reward file: OpenRLHF's HTTP client sends no Authorization
    header, the head answers 401, and OpenRLHF (after its retries) leaves the sample without a reward."""
    agent, _ = openrlhf
    plain = httpx.post(f"{keyed_head}/get_reward", json={"query": ["x"], "prompts": [""], "labels": ["x"]}, timeout=30)
    assert plain.status_code == 401
    out = _run(agent, f"{keyed_head}/get_reward", "Paris", "Paris")
    assert out["reward"] is None and out["scores"] is None


def test_openrlhf_reward_file_gets_our_rewards_from_a_keyed_head(openrlhf, keyed_head, monkeypatch):
    agent, samples_generator = openrlhf
    monkeypatch.setenv("GYMSERVE_HEAD_URL", keyed_head)
    monkeypatch.setenv("GYMSERVE_API_KEY", KEY)
    right = _run(agent, REWARD_FILE, "Paris", "Paris")
    wrong = _run(agent, REWARD_FILE, "Rome", "Paris")
    masked = _run(agent, REWARD_FILE, "Paris", '{"no_expected_answer": 1}')
    assert right["reward"] == [1.0] and right["scores"] == [1.0] and right["extra_logs"]["mask_sample"] == [False]
    assert wrong["reward"] == [0.0] and wrong["extra_logs"]["mask_sample"] == [False]
    assert masked["reward"] == [0.0] and masked["extra_logs"]["mask_sample"] == [True]
    experience = samples_generator.SamplesGenerator._process_response_into_experience(None, masked, max_len=64)
    assert experience.info["num_masked"].flatten().tolist() == [1]


def test_openrlhf_reward_file_masks_every_sample_when_the_head_is_down(openrlhf, monkeypatch, caplog):
    """An unreachable head is an infrastructure failure: masked like a failed verify, never a silent 0."""
    agent, _ = openrlhf
    with socket.socket() as sock, caplog.at_level(logging.WARNING, logger="gymserve.openrlhf_reward"):
        sock.bind(("127.0.0.1", 0))  # a port nothing listens on
        monkeypatch.setenv("GYMSERVE_HEAD_URL", f"http://127.0.0.1:{sock.getsockname()[1]}")
        monkeypatch.setenv("GYMSERVE_API_KEY", KEY)
        out = _run(agent, REWARD_FILE, "Paris", "Paris")
    assert out["reward"] == [0.0] and out["extra_logs"] == {"mask_sample": [True], "num_masked": 1}
    assert any("1 samples masked" in record.getMessage() for record in caplog.records)


def test_openrlhf_reward_file_raises_on_a_wrong_key(keyed_head, monkeypatch):
    """A 4xx is a setup error, not a sample failure: it raises instead of masking the whole run."""
    from services.core.errors import UpstreamError
    from trainer.adapters.openrlhf_reward import reward_func

    monkeypatch.setenv("GYMSERVE_HEAD_URL", keyed_head)
    monkeypatch.setenv("GYMSERVE_API_KEY", "not-the-key")
    with pytest.raises(UpstreamError, match="401"):
        reward_func(["Paris"], [""], ["Paris"])
