"""Throughput of code_jaccard, mcqa, instruction_following and reasoning_gym `/verify`.

    .venv/bin/python benchmarks/verify_envs.py [--env NAME ...] [--requests 2000] [--concurrency 64]

For each environment, in ONE run: the example rows (datasets/<env>/example.jsonl) with a
correct response, cycled to `--requests` items, are sent (a) one by one to `/verify` at
`--concurrency`, and (b) through `/verify/batch` in batches of 100; and (c) scored
in-process by the same pure functions with no HTTP (the limit; for reasoning_gym, whose
every score runs in the worker pool, the in-process rate times the number of workers).
Prints requests/s, p50/p99 latency of single requests, and both ratios to the limit.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gymserve.testing import ServerProcess, response_with_text  # noqa: E402
from services.core.client import ServiceClient  # noqa: E402
from services.resources.code_jaccard.scoring import jaccard_score  # noqa: E402
from services.resources.instruction_following.checks import check_row, parse_row  # noqa: E402
from services.resources.mcqa.extract import (DEFAULT_PATTERNS, compile_patterns, extract_letter,  # noqa: E402
                                             normalize_options)
from services.resources.reasoning_gym.scoring import score as rg_score  # noqa: E402

IF_ANSWERS = [  # one response per example row, in file order, that follows its instructions
    "<<Sea Song>>\nwaves roll in and out\nthe tide keeps time",
    "warm noodles with a rich broth are my favourite food.",
    "* keep a routine\n* keep the room dark\n* avoid late coffee",
    "\"A compiler translates source code into machine code. Any other questions?\"",
    "Dear Sam,\n*First* news and *second* news.\n\nP.S. write soon",
    "{\"name\": \"Ada\", \"age\": 36}",
    "Autumn leaves fall. The air is calm and dark at ease. Apples are harvested.",
]


def rows(env: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (ROOT / "datasets" / env / "example.jsonl").read_text().splitlines()]


def right_answer(env: str, i: int, row: dict[str, Any]) -> str:
    if env == "code_jaccard":
        return row.get("expected_answer", row.get("ground_truth"))
    if env == "mcqa":
        return f"Let me think.\n\\boxed{{{row['expected_answer']}}}" if row.get("grading_mode") else \
            f"Let me think.\nAnswer: {row['expected_answer']}"
    if env == "instruction_following":
        return IF_ANSWERS[i % len(IF_ANSWERS)]
    return f"Thinking.\n<answer>{row['reasoning_gym_entry']['answer']}</answer>"


def in_process(env: str) -> Callable[[dict[str, Any], str], float]:
    if env == "code_jaccard":
        return lambda row, text: jaccard_score(text, row.get("expected_answer", row.get("ground_truth")))
    if env == "mcqa":
        patterns = compile_patterns(DEFAULT_PATTERNS)
        return lambda row, text: float(extract_letter(text, normalize_options(row["options"]), patterns)
                                       == row["expected_answer"])
    if env == "instruction_following":
        return lambda row, text: float(all(check_row(text, parse_row(row["instruction_id_list"], row["kwargs"]),
                                                     False)))
    return lambda row, text: rg_score(row["task_name"], text, row["reasoning_gym_entry"],
                                      source=row.get("reasoning_gym_dataset"))[0]


async def singles(url: str, bodies: list[dict[str, Any]], concurrency: int) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    ok = 0
    queue = iter(bodies)
    # The core client (aiohttp): httpx spends milliseconds of CPU per call at this concurrency,
    # which on a 2-core machine is taken from the server being measured.
    client = ServiceClient(max_connections=concurrency, retries=0)

    async def worker() -> None:
        nonlocal ok
        for body in queue:
            start = time.perf_counter()
            reply = await client.request("POST", f"{url}/verify", json=body, deadline_s=120.0)
            latencies.append(time.perf_counter() - start)
            ok += reply.status_code == 200 and reply.json().get("reward") == 1.0
    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start, latencies, ok
    finally:
        await client.aclose()


async def batches(url: str, bodies: list[dict[str, Any]], size: int, concurrency: int) -> tuple[float, int]:
    chunks = [bodies[i:i + size] for i in range(0, len(bodies), size)]
    ok = 0
    async with httpx.AsyncClient(timeout=300.0) as client:
        semaphore = asyncio.Semaphore(max(1, concurrency // size) + 1)

        async def send(chunk: list[dict[str, Any]]) -> None:
            nonlocal ok
            async with semaphore:
                reply = await client.post(f"{url}/verify/batch", json=chunk)
                ok += sum(r.get("reward") == 1.0 for r in reply.json())
        start = time.perf_counter()
        await asyncio.gather(*(send(c) for c in chunks))
        return time.perf_counter() - start, ok


def bench(env: str, total: int, concurrency: int, workers: int) -> None:
    examples = rows(env)
    items = [(row, right_answer(env, i % len(examples), row)) for i, row in
             ((i, examples[i % len(examples)]) for i in range(total))]
    bodies = [{**{k: v for k, v in row.items() if k != "agent_ref"}, "response": response_with_text(text)}
              for row, text in items]
    fn = in_process(env)
    fn(*items[0])  # warm caches, as the servers' workers are warm
    start = time.perf_counter()
    correct = sum(fn(row, text) == 1.0 for row, text in items)
    local_rate = total / (time.perf_counter() - start)
    pooled = env == "reasoning_gym"
    limit = local_rate * workers if pooled else local_rate
    with ServerProcess(f"resources/{env}", f"workers={workers}") as server:
        asyncio.run(singles(server.url, bodies[:100], concurrency))  # warm-up
        seconds, latencies, ok_single = asyncio.run(singles(server.url, bodies, concurrency))
        batch_seconds, ok_batch = asyncio.run(batches(server.url, bodies, 100, concurrency))
    single_rate, batch_rate = total / seconds, total / batch_seconds
    q = statistics.quantiles(latencies, n=100)
    pool_note = f" = x{workers} workers" if pooled else ""
    print(f"{env:22s} in-process {local_rate:9.0f}/s (limit {limit:8.0f}/s{pool_note}) | "
          f"/verify {single_rate:7.0f}/s p50 {q[49] * 1000:6.1f} ms p99 {q[98] * 1000:6.1f} ms "
          f"ratio {single_rate / limit:.2f} | /verify/batch {batch_rate:7.0f}/s ratio {batch_rate / limit:.2f} | "
          f"reward 1: {correct}/{ok_single}/{ok_batch} of {total}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    envs = ["code_jaccard", "mcqa", "instruction_following", "reasoning_gym"]
    parser.add_argument("--env", choices=envs, action="append")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    print(f"{args.requests} requests per environment, concurrency {args.concurrency}, {os.cpu_count()} cores")
    for env in args.env or envs:
        bench(env, args.requests, args.concurrency, args.workers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
