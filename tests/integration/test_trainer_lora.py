"""`gymserve train` with `lora` enabled against real servers (head, models/hf, code_jaccard,
simple_agent): the policy server takes the merged weights every step (its `weights_version`
advances, its logprobs agree with the trainer's), and after the run it serves exactly the
trainer's final model: base + adapter merged by peft's `merge_and_unload()`.

The policy is a tiny 2-layer model taught two code replies, so its samples at temperature 1
vary around them and code_jaccard's graded reward gives the groups a nonzero advantage (an
untaught random model scores 0 everywhere and LoRA's B matrices would stay at zero)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration._trainer_stack import small_stack

REPO = Path(__file__).resolve().parents[2]
STEPS = 2
TASKS = [("Write a Python function `add(a, b)` that returns the sum of a and b. Reply with code only.",
          "def add(a, b):\n    return a + b"),
         ("Write a Python one-liner that reverses the string `s`. Reply with code only.", "s[::-1]")]


@pytest.fixture(scope="module")
def taught_model(tmp_path_factory):
    from transformers import AutoTokenizer

    from services.models.hf.embedded import embedded_model_dir
    from services.models.hf.templates import ChatFormat
    from services.models.hf.tiny import make_tiny_model

    fmt = ChatFormat(AutoTokenizer.from_pretrained(str(embedded_model_dir())))
    teach = [(fmt.render([{"role": "user", "content": q}]), a) for q, a in TASKS]
    return make_tiny_model(tmp_path_factory.mktemp("lora") / "model", teach=teach, seed=1)


def _logprobs(model, prompt_ids: list[int], gen_ids: list[int]) -> list[float]:
    """Each generated token's logprob, computed the way models/hf decodes (the prompt at once, then one
    token at a time on the KV cache), so both sides run the same float operations: one forward pass
    over the whole sequence differs from the server by up to 1e-4 on this sharp tiny model."""
    import torch

    logps = []
    with torch.no_grad():
        mask = torch.ones((1, len(prompt_ids)), dtype=torch.long)
        positions = mask.cumsum(-1) - 1
        out = model(input_ids=torch.tensor([prompt_ids]), attention_mask=mask, position_ids=positions,
                    use_cache=True, logits_to_keep=1)
        for token in gen_ids:
            logits = out.logits[0, -1].float()
            logps.append(float(logits[token] - torch.logsumexp(logits, dim=-1)))
            mask = torch.cat([mask, torch.ones((1, 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
            out = model(input_ids=torch.tensor([[token]]), attention_mask=mask, position_ids=positions,
                        past_key_values=out.past_key_values, use_cache=True)
    return logps


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_lora_run_syncs_merged_weights_to_the_policy_server(taught_model, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({
        "responses_create_params": {"input": [{"role": "user", "content": q}]}, "expected_answer": a,
        "agent_ref": {"type": "responses_api_agents", "name": "code_jaccard_simple_agent"}}) + "\n"
        for q, a in TASKS))
    config = tmp_path / "lora.yaml"
    config.write_text(json.dumps({
        "model": str(taught_model), "train_data": str(data), "output_dir": str(tmp_path / "run"),
        "weight_sync": {"enabled": True}, "progress": False, "plot": False,
        "lora": {"enabled": True, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "grpo": {"max_steps": STEPS, "num_generations": 4, "per_device_train_batch_size": 8,
                 "max_completion_length": 16, "temperature": 1.0, "learning_rate": 0.01, "beta": 0.0,
                 "loss_type": "dapo", "logging_steps": 1, "seed": 0}}))
    servers = [("models/hf", "policy_model", [f"model={taught_model}", "accept_weights=true", "torch_threads=1",
                                              "max_model_len=512"]),
               ("resources/code_jaccard", "code_jaccard", []),
               ("agents/simple_agent", "code_jaccard_simple_agent",
                ["resources_server=code_jaccard", "model_server=policy_model"])]
    with small_stack(servers, ready_timeout_s=300) as (head, started):
        policy = started["policy_model"].url
        env = {**os.environ, "GYMSERVE_HEAD_URL": head.url, "PYTHONUNBUFFERED": "1"}
        result = subprocess.run([sys.executable, "-m", "gymserve", "train", "-c", str(config)],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=800)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
        version = httpx.get(f"{policy}/v1/models", timeout=30).json()["data"][0]["weights_version"]
        body = {"input": [{"role": "user", "content": TASKS[0][0]}], "temperature": 1.0, "seed": 7,
                "max_output_tokens": 12}
        reply = httpx.post(f"{policy}/v1/responses", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    # synced before both batches, then once more with the final weights (a fresh server starts at 0)
    assert version == STEPS + 1
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "loss" in s]
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    # the server samples with the merged weights of the step that trains on the batch: the trainer's
    # (unmerged, adapter-on) logprobs of the sampled tokens agree with the server's
    assert all(s["policy/lag_max"] == 0 and s["policy/logp_delta_max"] < 1e-3 for s in steps), steps
    final = tmp_path / "run" / "final"
    assert (final / "adapter_config.json").exists()  # save_final keeps the adapter, peft's format
    base = AutoModelForCausalLM.from_pretrained(str(taught_model)).eval()
    merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(taught_model)),
                                       str(final)).merge_and_unload().eval()
    item = reply.json()["output"][-1]
    assert item["policy_version"] == STEPS + 1
    prompt, generated, served = item["prompt_token_ids"], item["generation_token_ids"], item["generation_log_probs"]
    ours = _logprobs(merged, prompt, generated)
    assert max(abs(a - b) for a, b in zip(ours, served)) < 1e-4, (ours, served)
    # and the adapter really moved the policy: the base model's logprobs are elsewhere
    assert max(abs(a - b) for a, b in zip(_logprobs(base, prompt, generated), served)) > 1e-3
