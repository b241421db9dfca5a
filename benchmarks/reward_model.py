"""Reward-model serving throughput: `/score` at concurrency 32 vs a raw batched forward loop (the limit).

    .venv/bin/python benchmarks/reward_model.py [--n 128] [--concurrency 32] [--layers 4] [--hidden 256]

Builds a small random Llama reward model offline, starts the real server
(`gymserve serve resources/reward_model`, a subprocess), and in this one run measures:
  * limit: this process loads the same model and runs `model(input_ids, attention_mask)`
    over the same token ids in batches of `batch_size`, in input order (what a hand-written
    scoring loop does; no HTTP, no tokenization, no queueing);
  * served: N conversations sent as N `/score` requests (one conversation each) by
    `concurrency` concurrent clients; the server tokenizes, batches and scores them.
The limit is the fastest of several batch sizes. Rounds alternate limit and served runs; the
best of each is compared (the machine is shared). Both sides run with OMP_WAIT_POLICY=PASSIVE
and in their own sessions (see `in_own_session`).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402
try:
    import psutil  # only for the CPU-seconds diagnostic
except ImportError:  # pragma: no cover
    psutil = None
import torch  # noqa: E402

from gymserve.testing import ServerProcess  # noqa: E402
from services.resources.reward_model.formatting import Encoder  # noqa: E402
from services.resources.reward_model.scorer import load_tokenizer  # noqa: E402
from services.resources.reward_model.tiny_model import build_tiny_reward_model  # noqa: E402

WORDS = ("the quick brown fox jumps over lazy dog what is two plus four reward model scores a conversation "
         "between user and assistant please write short poem about sea sky capital of france paris rome").split()


def conversations(n: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    return [[{"role": "user", "content": text(10, 60)}, {"role": "assistant", "content": text(10, 90)}]
            for _ in range(n)]


def _cpu(process) -> float:
    if process is None:
        return 0.0
    times = process.cpu_times()
    return times.user + times.system


def limit_run(model, batches: list[list[list[int]]], pad_id: int) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        for batch in batches:
            width = max(len(s) for s in batch)
            ids = torch.tensor([s + [pad_id] * (width - len(s)) for s in batch], device=model.device)
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in batch], device=model.device)
            model(input_ids=ids, attention_mask=mask).logits[:, 0].tolist()
    return time.perf_counter() - start


async def served_run(url: str, convs: list, concurrency: int) -> tuple[float, list[float]]:
    """`concurrency` clients each posting one conversation per `/score` request until all are scored.

    aiohttp as the client: on a 2-core machine the client shares the CPU with the server, and
    aiohttp costs ~0.2 ms of CPU per request where httpx costs several ms."""
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as client:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(len(convs)):
            queue.put_nowait(i)
        scores = [0.0] * len(convs)

        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                body = json.dumps({"conversations": [convs[i]]})
                async with client.post("/score", data=body, headers={"content-type": "application/json"}) as reply:
                    if reply.status != 200:
                        raise RuntimeError(f"/score answered {reply.status}: {await reply.text()}")
                    scores[i] = (await reply.json())["scores"][0]

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start, scores


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128, help="conversations per run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--limit-batch-sizes", default="16,32",
                        help="the limit is the fastest of these batch sizes (on CPU, smaller batches can be faster)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    parser.add_argument("--precision", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()

    from transformers import AutoModelForSequenceClassification

    with tempfile.TemporaryDirectory(prefix="rm-bench-") as tmp:
        model_dir = str(build_tiny_reward_model(Path(tmp) / "rm", hidden_size=args.hidden, num_layers=args.layers,
                                                num_heads=max(1, args.hidden // 64)))
        tokenizer = load_tokenizer(model_dir)
        encoder = Encoder(tokenizer, max_model_len=2048)
        convs = conversations(args.n, seed=0)
        sequences = [encoder.encode_conversation(c).ids for c in convs]
        tokens = sum(len(s) for s in sequences)
        limit_sizes = sorted({int(x) for x in args.limit_batch_sizes.split(",")} | {args.batch_size})
        batchings = {size: [sequences[i:i + size] for i in range(0, len(sequences), size)] for size in limit_sizes}
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.precision]
        model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=dtype).to(args.device).eval()
        # the limit runs on one dedicated thread, as the server's forward passes do (on this CPU torch ran
        # faster there than on the main thread): the comparison is then about serving, not threading
        thread = ThreadPoolExecutor(1, thread_name_prefix="limit")
        for size_batches in batchings.values():  # warm-up: every shape once
            thread.submit(limit_run, model, size_batches, tokenizer.pad_token_id).result()
        params = sum(p.numel() for p in model.parameters())
        where = "CPU" if args.device == "cpu" else torch.cuda.get_device_name(torch.device(args.device))
        print(f"model: Llama {args.layers} layers, hidden {args.hidden}, {params / 1e6:.1f}M params, {args.precision}, "
              f"{where} ({torch.get_num_threads()} torch threads)")
        print(f"inputs: {args.n} conversations, {tokens} tokens (mean {tokens / args.n:.0f}), "
              f"batch_size {args.batch_size}, concurrency {args.concurrency}, {args.rounds} rounds")

        limit_times: dict[int, list[float]] = {size: [] for size in limit_sizes}
        served_times: list[float] = []
        me = psutil.Process() if psutil else None
        limit_cpu = served_cpu = 0.0
        device = "cpu" if args.device == "cpu" else args.device.removeprefix("cuda:").replace("cuda", "0")
        with ServerProcess("resources/reward_model", f"model_name={model_dir}", f"device={device}",
                           f"precision={args.precision}", f"batch_size={args.batch_size}",
                           f"max_wait_ms={args.max_wait_ms}", "max_tokens_per_batch=1000000", name="rm_bench",
                           ready_timeout_s=300) as server:
            srv = psutil.Process(server.proc.pid) if psutil else None
            asyncio.run(served_run(server.url, convs, args.concurrency))  # warm-up
            for _ in range(args.rounds):
                for size, size_batches in batchings.items():
                    c0 = _cpu(me)
                    limit_times[size].append(thread.submit(limit_run, model, size_batches,
                                                           tokenizer.pad_token_id).result())
                    limit_cpu += (_cpu(me) - c0) / len(batchings)
                c0 = _cpu(srv)
                elapsed, scores = asyncio.run(served_run(server.url, convs, args.concurrency))
                served_cpu += _cpu(srv) - c0
                served_times.append(elapsed)
            stats = server.get("/stats").json()
        with torch.inference_mode():  # the served scores are the model's
            check = model(input_ids=torch.tensor([sequences[0]], device=args.device)).logits[0, 0].item()
        assert abs(check - scores[0]) < (1e-3 if args.precision == "float32" else 5e-2), (check, scores[0])

    best_size = min(limit_sizes, key=lambda size: min(limit_times[size]))
    best_limit, best_served = min(limit_times[best_size]), min(served_times)
    for size in limit_sizes:
        print(f"limit, batches of {size:3d}: {args.n / min(limit_times[size]):8.1f} seq/s "
              f"(runs: {', '.join(f'{t:.2f}s' for t in limit_times[size])})")
    print(f"limit  (raw batched forward loop): {args.n / best_limit:8.1f} seq/s {tokens / best_limit:10.0f} tok/s "
          f"(best batch size: {best_size})")
    print(f"served (/score, concurrency {args.concurrency}):   {args.n / best_served:8.1f} seq/s "
          f"{tokens / best_served:10.0f} tok/s (runs: {', '.join(f'{t:.2f}s' for t in served_times)})")
    print(f"server batches: mean size {stats['mean_batch_size']:.1f}, padding {100 * stats['padding_fraction']:.1f}%")
    if psutil and args.device == "cpu":
        print(f"CPU seconds per 100 sequences: limit {100 * limit_cpu / (args.rounds * args.n):.2f}, "
              f"server process {100 * served_cpu / (args.rounds * args.n):.2f} (HTTP, JSON, tokenization included)")
    print(f"ratio served/limit: {best_limit / best_served:.3f} (sequences/s and tokens/s alike; aim >= 0.85)")
    if args.device == "cpu":
        print("GPU (bfloat16): not measured in this run (run with --device cuda --precision bfloat16 on a GPU)")
    return 0


def in_own_session() -> int:
    """Re-run in a new session: Linux autogroup scheduling then treats this process (the limit) and the
    server subprocess (which `ServerProcess` starts in its own session) alike on a shared machine."""
    import os
    import subprocess

    if os.environ.get("GYMSERVE_BENCH_CHILD") == "1":
        return main()
    # Both sides (this process and the server it starts) inherit OMP_WAIT_POLICY=PASSIVE: on a busy
    # 2-core machine OpenMP threads spinning at barriers otherwise cost 2-3x CPU, at random.
    env = {**os.environ, "GYMSERVE_BENCH_CHILD": "1"}
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    child = subprocess.run([sys.executable, __file__, *sys.argv[1:]], start_new_session=True, env=env)
    return child.returncode


if __name__ == "__main__":
    raise SystemExit(in_own_session())
