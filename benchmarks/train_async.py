"""Training step time with asynchronous rollouts (`max_policy_lag: 1`) vs synchronous (`0`), in one run.

    .venv/bin/python benchmarks/train_async.py [--steps 6] [--rollout-s 1.0]

Both runs use the same config: gymserve's GRPO trainer (trainer/grpo.py) and rollout function
(trainer/trl.py) training a tiny one-layer Llama on CPU, 2 prompts x 4 samples per step. The
agent is a real HTTP server on 127.0.0.1 that answers each `/run` after `--rollout-s` seconds
with training token ids (a stand-in for a policy server's generation time, so the figure
isolates the overlap and not a model's speed). Synchronous: every step waits for its rollouts.
Asynchronous: the next batch's rollouts run while the current step trains. Prints the mean
step time of each (the first step, which has nothing to overlap with, is left out) and the
machine's load average: on a shared machine the figures move with the load.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def agent_app(tokenizer: Any, rollout_s: float) -> FastAPI:
    app = FastAPI()

    @app.post("/run")
    async def run(request: Request) -> dict[str, Any]:
        row = await request.json()
        await asyncio.sleep(rollout_s)
        prompt = tokenizer.apply_chat_template(row["responses_create_params"]["input"], add_generation_prompt=True,
                                               tokenize=True)
        prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
        gen = [100 + (row["_ng_rollout_index"] * 7 + k) % 900 for k in range(7)] + [tokenizer.eos_token_id]
        out = [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "y"}],
                "prompt_token_ids": prompt, "generation_token_ids": gen, "generation_log_probs": [-1.0] * len(gen)}]
        return {**row, "response": {"output": out}, "reward": float(row["_ng_rollout_index"] % 2)}

    return app


def serve(app: Any) -> tuple[str, Any, threading.Thread]:
    import uvicorn

    from services.core.ports import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server, thread


def step_times(tokenizer: Any, url: str, steps: int, lag: int) -> list[float]:
    """Seconds between consecutive optimizer steps of one run."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback
    from trl import GRPOConfig

    from trainer.client import run_sync
    from trainer.grpo import trainer_class
    from trainer.trl import make_rollout_func, reward_functions, to_trl_dataset

    marks: list[float] = []

    class Marks(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            marks.append(time.perf_counter())

    rows = [{"responses_create_params": {"input": [{"role": "user", "content": f"question {i}"}]},
             "agent_ref": {"type": "responses_api_agents", "name": "bench_agent"}} for i in range(2 * steps)]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=512, eos_token_id=tokenizer.eos_token_id,
                                         pad_token_id=tokenizer.pad_token_id))
    rollout = make_rollout_func(None, tokenizer, agents={"bench_agent": url}, max_policy_lag=lag)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, max_steps=steps, num_generations=4,
                          per_device_train_batch_size=8, learning_rate=1e-3, logging_steps=1, report_to="none",
                          save_strategy="no", beta=0.0, max_completion_length=16, disable_tqdm=True)
        trainer = trainer_class()(model=model, reward_funcs=reward_functions(), args=args,
                                  train_dataset=to_trl_dataset(rows), processing_class=tokenizer,
                                  rollout_func=rollout, callbacks=[Marks()])
        start = time.perf_counter()
        try:
            trainer.train()
        finally:
            if rollout.queue is not None:
                rollout.queue.close()
            run_sync(rollout.client.aclose)
    return [b - a for a, b in zip([start, *marks], marks)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rollout-s", type=float, default=1.0, help="seconds each /run takes")
    opts = parser.parse_args()
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoTokenizer

    from services.models.hf.embedded import embedded_model_dir

    tokenizer = AutoTokenizer.from_pretrained(str(embedded_model_dir()))
    url, server, thread = serve(agent_app(tokenizer, opts.rollout_s))
    try:
        results = {lag: step_times(tokenizer, url, opts.steps, lag) for lag in (0, 1)}
    finally:
        server.should_exit = True
        thread.join(10)
    load = os.getloadavg()
    print(f"{opts.steps} steps, 2 prompts x 4 samples, rollout {opts.rollout_s:g}s, "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores")
    means = {}
    for lag, times in results.items():
        later = times[1:] or times
        means[lag] = sum(later) / len(later)
        name = "sync  (max_policy_lag 0)" if lag == 0 else "async (max_policy_lag 1)"
        print(f"{name}: mean step {means[lag]:.2f}s (steps 2..{len(times)}), first step {times[0]:.2f}s")
    print(f"async / sync step time: {means[1] / means[0]:.2f}")


if __name__ == "__main__":
    main()
