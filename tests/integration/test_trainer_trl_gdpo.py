"""A real trl.GRPOTrainer step with our rollout_func, GDPO reward functions, multi-turn env_mask
and masked failures. Most tests use a scripted HTTP agent that returns verify replies with
training token fields (two model calls, reward components, some masked), so TRL's contract is
checked in seconds; one slow test runs the real path (simple_agent, models/hf, math_multi_reward)."""
from __future__ import annotations

import json
import random
import socket
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request

from services.core.ports import free_port


def _agent_app(tokenizer) -> FastAPI:
    app = FastAPI()
    rng = random.Random(0)
    app.state.calls = []

    @app.post("/run")
    async def run(request: Request):
        row = await request.json()
        app.state.calls.append(row)
        if row.get("fail"):
            return {**row, "reward": 0.0, "mask_sample": True, "failure_kind": "timeout",
                    "failure_reason": "scripted failure", "response": {"output": []}}
        prompt = tokenizer.apply_chat_template(row["responses_create_params"]["input"], add_generation_prompt=True,
                                               tokenize=True)
        if hasattr(prompt, "keys"):
            prompt = prompt["input_ids"]
        prompt = list(prompt)
        gen1 = [rng.randrange(100, 1000) for _ in range(3)]
        tool = [rng.randrange(100, 1000) for _ in range(2)]
        gen2 = [rng.randrange(100, 1000) for _ in range(2)] + [tokenizer.eos_token_id]
        out = [{"type": "function_call", "name": "t", "arguments": "{}", "call_id": "c",
                "prompt_token_ids": prompt, "generation_token_ids": gen1, "generation_log_probs": [-1.0] * 3},
               {"type": "function_call_output", "call_id": "c", "output": "x"},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "y"}],
                "prompt_token_ids": prompt + gen1 + tool, "generation_token_ids": gen2,
                "generation_log_probs": [-0.5] * 3}]
        comps = {"correct": float(rng.random() < 0.5), "format": rng.random()}
        return {**row, "response": {"output": out}, "reward": sum(comps.values()), "reward_components": comps,
                "num_turns": 2}

    return app


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from services.models.hf.embedded import embedded_model_dir

    return AutoTokenizer.from_pretrained(str(embedded_model_dir()))


@pytest.fixture(scope="module")
def agent(tokenizer):
    app = _agent_app(tokenizer)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    yield app, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_grpo_trainer_step_with_gdpo_and_masked_samples(tokenizer, agent, tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from trainer.trl import make_rollout_func, reward_functions, to_trl_dataset

    app, url = agent
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": f"question {i}"}]},
             "agent_ref": {"type": "responses_api_agents", "name": "scripted_agent"}, "expected_answer": str(i),
             **({"fail": True} if i == 1 else {})} for i in range(2)]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=512, eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seen = []
    rollout = make_rollout_func(None, tokenizer, agents={"scripted_agent": url}, on_records=seen.extend)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, max_steps=1, num_generations=4,
                      per_device_train_batch_size=8, learning_rate=1e-3, logging_steps=1, report_to="none",
                      save_strategy="no", multi_objective_aggregation="normalize_then_sum", beta=0.0,
                      max_completion_length=16, gradient_checkpointing=False)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_functions(["correct", "format"]), args=args,
                          train_dataset=to_trl_dataset(rows), processing_class=tokenizer, rollout_func=rollout)
    trainer.train()
    assert len(app.state.calls) == 8
    assert sorted((c["_ng_task_index"], c["_ng_rollout_index"]) for c in app.state.calls) == \
        [(t, k) for t in range(2) for k in range(4)]
    assert all(c["responses_create_params"]["max_output_tokens"] == 16 for c in app.state.calls)
    assert sum(1 for r in seen if r.get("mask_sample")) == 4
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and "rewards/reward_correct/mean" in logs[0] and "rewards/reward_format/mean" in logs[0]
    changed = [k for k, v in model.state_dict().items() if not torch.equal(before[k], v)]
    assert changed, "the optimizer step changed no weight"
    # the masked group contributed nothing: its rewards are NaN in TRL's completions log
    rewards = trainer._logs["rewards"]["reward_correct"]
    assert sum(1 for r in rewards if r != r) == 4  # NaN != NaN


def test_stitched_rollout_has_env_mask(tokenizer, agent):
    from trainer.trl import make_rollout_func, row_prompt

    _, url = agent
    row = {"responses_create_params": {"input": [{"role": "user", "content": "hello"}]},
           "agent_ref": {"name": "scripted_agent"}}
    rollout = make_rollout_func(None, tokenizer, rows=[row], agents={"scripted_agent": url})
    out = rollout([row_prompt(row)] * 2, None)
    assert out["env_mask"][0] == [1, 1, 1, 0, 0, 1, 1, 1]
    assert out["logprobs"][0][3:5] == [0.0, 0.0]
    assert out["num_turns"] == [2, 2] and set(out) >= {"reward_correct", "reward_format", "env_reward"}
    assert json.dumps(out)  # plain JSON-able lists


def test_all_failed_batch_leaves_weights_finite(tokenizer, agent, tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from trainer.trl import make_rollout_func, reward_functions, to_trl_dataset

    _, url = agent
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": f"down {i}"}]},
             "agent_ref": {"name": "scripted_agent"}, "fail": True} for i in range(2)]
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, max_steps=1, num_generations=2,
                      per_device_train_batch_size=4, learning_rate=1e-2, report_to="none", save_strategy="no",
                      beta=0.0, gradient_checkpointing=False)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_functions(), args=args, train_dataset=to_trl_dataset(rows),
                          processing_class=tokenizer,
                          rollout_func=make_rollout_func(None, tokenizer, agents={"scripted_agent": url}))
    trainer.train()
    # TRL clamps the loss normalizer to >= 1 token, so a batch with no loss token is a finite no-op step
    assert all(torch.isfinite(p).all() for p in model.parameters()), "an all-failed batch produced NaN weights"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grpo_gdpo_step_through_real_agent_and_model(tokenizer, tmp_path):
    """No scripted parts: rollouts come from a real simple_agent, `models/hf` (the tiny model, SmolLM2's
    tokenizer) and math_multi_reward's three reward components; TRL trains on the model's own token IDs."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from gymserve.testing import ServerProcess
    from services.models.hf.tiny import tiny_tool_model
    from trainer.jsonl import read_rows
    from trainer.trl import make_rollout_func, reward_functions, to_trl_dataset

    rows = read_rows(Path(__file__).parents[2] / "datasets" / "math_multi_reward" / "example.jsonl")[:2]
    for row in rows:
        row["agent_ref"] = {"type": "responses_api_agents", "name": "gdpo_agent"}
    components = ["correctness", "format", "integer"]
    with ServerProcess("models/hf", f"model={tiny_tool_model()}", "max_model_len=2048") as policy, \
            ServerProcess("resources/math_multi_reward") as env, \
            ServerProcess("agents/simple_agent", f"resources_url={env.url}", f"model_url={policy.url}",
                          name="gdpo_agent") as agent:
        seen: list[dict] = []
        rollout = make_rollout_func(None, tokenizer, agents={"gdpo_agent": agent.url}, on_records=seen.extend)
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                             max_position_embeddings=2048, eos_token_id=tokenizer.eos_token_id,
                                             pad_token_id=tokenizer.pad_token_id))
        args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, max_steps=1, num_generations=2,
                          per_device_train_batch_size=4, learning_rate=1e-3, logging_steps=1, report_to="none",
                          save_strategy="no", multi_objective_aggregation="normalize_then_sum", beta=0.0,
                          max_completion_length=8, gradient_checkpointing=False)
        trainer = GRPOTrainer(model=model, reward_funcs=reward_functions(components), args=args,
                              train_dataset=to_trl_dataset(rows), processing_class=tokenizer, rollout_func=rollout)
        trainer.train()
    assert len(seen) == 4 and not any(r.get("mask_sample") for r in seen), [r.get("failure_reason") for r in seen]
    for record in seen:
        assert sorted(record["reward_components"]) == components
        assert record["reward"] == pytest.approx(sum(record["reward_components"].values()))
        message = [i for i in record["response"]["output"] if i.get("generation_token_ids")][-1]
        assert 0 < len(message["generation_token_ids"]) <= 8  # max_completion_length reached the model
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert logs and len(trainer._logs["completion"]) == 4
    for name in components:  # TRL logged exactly the components the environment gave
        mean = sum(r["reward_components"][name] for r in seen) / len(seen)
        assert logs[0][f"rewards/reward_{name}/mean"] == pytest.approx(mean)
    # the weights move only where a group's rewards differ (GRPO's advantage); the untrained tiny
    # policy ties them, so the step must at least leave every weight finite
    assert all(torch.isfinite(v).all() for v in model.state_dict().values())


def test_async_rollouts_take_every_step_batch_from_the_queue(tokenizer, agent, tmp_path):
    """max_policy_lag 1: the trainer reads one batch ahead and each step's rollouts were started before it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig

    from trainer.client import run_sync
    from trainer.grpo import trainer_class
    from trainer.trl import make_rollout_func, reward_functions, to_trl_dataset
    from trainer.weight_sync import PolicyHooks

    app, url = agent
    app.state.calls.clear()
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": f"async question {i}"}]},
             "agent_ref": {"type": "responses_api_agents", "name": "scripted_agent"}, "expected_answer": str(i)}
            for i in range(4)]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=512, eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id))
    hooks = PolicyHooks(None)
    rollout = make_rollout_func(None, tokenizer, agents={"scripted_agent": url}, max_policy_lag=1,
                                on_stats=hooks.on_stats)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, max_steps=3, num_generations=4,
                      per_device_train_batch_size=8, learning_rate=1e-3, logging_steps=1, report_to="none",
                      save_strategy="no", beta=0.0, max_completion_length=16, gradient_checkpointing=False)
    trainer = trainer_class()(model=model, reward_funcs=reward_functions(), args=args,
                              train_dataset=to_trl_dataset(rows), processing_class=tokenizer, rollout_func=rollout)
    try:
        trainer.train()
    finally:
        rollout.queue.close()
        run_sync(rollout.client.aclose)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["policy/prefetch_hit"] for h in logs] == [1.0, 1.0, 1.0]
    assert rollout.queue.stats["hits"] == 3 and rollout.queue.stats["misses"] == 0
    trained = {(c["_gymserve_batch"], c["responses_create_params"]["input"][0]["content"]) for c in app.state.calls}
    assert {batch for batch, _ in trained} >= {0, 1, 2}
    assert len(app.state.calls) >= 24  # three steps of 2 prompts x 4 samples, plus a batch read ahead
