"""Judged verification: `/verify` with a judge model vs the judge model's raw batched throughput.

Run: `.venv/bin/python benchmarks/judge.py [--items 48] [--concurrency 16] [--tokens 16] [--embedded]`

A real `models/hf` server is the judge (a tiny 2-layer model built locally by default, the
embedded SmolLM2-135M with `--embedded`) and `resources/equivalence_llm_judge` asks it one
question per verify (`check_twice_swap=false`). The reference sends the very same judge requests
(same messages, same `max_output_tokens`, temperature 0) straight to the model server at the same
concurrency: what the judge path could do if the environment cost nothing. The reference runs
before and after the judged pass and their mean counts. A third pass re-verifies the same rollouts:
every question should be answered by the judge cache (hit rate 1.0, no model call).

Neither model judges well; the equal label is set to a letter any reply contains, so replies parse
and are cached (a reply that does not parse is masked and never cached). This measures the judge
path's overhead, not judging quality.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gymserve.testing import ServerProcess, verify_body  # noqa: E402
from services.core.judge import PromptTemplate  # noqa: E402
from services.resources.equivalence_llm_judge.app import (JUDGE_FIELDS, JUDGE_PROMPT_TEMPLATE,  # noqa: E402
                                                         JUDGE_SYSTEM_MESSAGE)

EQUAL_LABEL = "n"  # every reply of both models seen so far contains one; see the module docstring


def make_items(n: int) -> list[dict[str, Any]]:
    """Distinct verify bodies: a question, a reference and an answer each."""
    items = []
    for i in range(n):
        question = f"Which number comes after {100 + i}?"
        items.append(verify_body(f"It is {101 + i + i % 3}.", question=question, expected_answer=str(101 + i)))
    return items


def judge_requests(items: list[dict[str, Any]], tokens: int) -> list[dict[str, Any]]:
    """The requests the environment sends for `items` (same template, same fields)."""
    template = PromptTemplate(JUDGE_PROMPT_TEMPLATE, JUDGE_SYSTEM_MESSAGE, fields=JUDGE_FIELDS)
    out = []
    for item in items:
        answer = item["response"]["output"][0]["content"][0]["text"].strip()
        messages = template.messages(question=item["question"], expected_answer=item["expected_answer"],
                                     generated_answer=answer)
        out.append({"input": messages, "max_output_tokens": tokens, "temperature": 0})
    return out


async def post_all(url: str, bodies: list[dict[str, Any]], concurrency: int) -> tuple[float, list[dict[str, Any]]]:
    """POST every body with `concurrency` in flight; (seconds, replies)."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(bodies)):
        queue.put_nowait(i)
    replies: list[dict[str, Any]] = [{}] * len(bodies)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as http:
        async def worker() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                async with http.post(url, json=bodies[i]) as r:
                    replies[i] = await r.json()
                    if r.status != 200:
                        raise RuntimeError(f"{url}: {r.status} {replies[i]}")
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started, replies


def metric(text: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model_options = ["max_batch_size=16", "max_model_len=1024", f"default_max_tokens={args.tokens}"]
    if not args.embedded:
        from services.models.hf.tiny import tiny_tool_model
        model_options.insert(0, f"model={tiny_tool_model()}")
    items = make_items(args.items)
    requests = judge_requests(items, args.tokens)
    with ServerProcess("models/hf", *model_options, name="bench_judge_model", ready_timeout_s=600) as model, \
            ServerProcess("resources/equivalence_llm_judge", f"judge_model_server={model.url}",
                          "check_twice_swap=false", f"judge_equal_label={EQUAL_LABEL}",
                          f"judge_responses_create_params={{max_output_tokens: {args.tokens}, temperature: 0}}",
                          f"judge_endpoint_max_concurrency={args.concurrency}", "judge_deadline_s=1200",
                          name="bench_judged_env") as env:
        await post_all(f"{model.url}/v1/responses", requests[: args.concurrency], args.concurrency)  # warm-up
        raw_before, _ = await post_all(f"{model.url}/v1/responses", requests, args.concurrency)
        judged, replies = await post_all(f"{env.url}/verify", items, args.concurrency)
        raw_after, _ = await post_all(f"{model.url}/v1/responses", requests, args.concurrency)
        calls_before = metric(env.get("/metrics").text, "gymserve_judge_calls_total")
        hits_before = metric(env.get("/metrics").text, "gymserve_judge_cache_hits_total")
        reverify, again = await post_all(f"{env.url}/verify", items, args.concurrency)
        page = env.get("/metrics").text
        hits = metric(page, "gymserve_judge_cache_hits_total") - hits_before
        calls = metric(page, "gymserve_judge_calls_total") - calls_before
    raw_rate = 2 * args.items / (raw_before + raw_after)
    judged_rate = args.items / judged
    masked = sum(bool(r.get("mask_sample")) for r in replies)
    same = sum(a.get("reward") == b.get("reward") for a, b in zip(replies, again))
    return {"items": args.items, "concurrency": args.concurrency, "tokens": args.tokens,
            "model": "embedded SmolLM2-135M" if args.embedded else "tiny 2-layer Llama",
            "raw_per_s": round(raw_rate, 2), "raw_before_s": round(raw_before, 2), "raw_after_s": round(raw_after, 2),
            "judged_verifies_per_s": round(judged_rate, 2), "ratio": round(judged_rate / raw_rate, 3),
            "masked": masked, "first_masked_reason": next((r["failure_reason"] for r in replies if r.get("mask_sample")),
                                                           None), "reverify_per_s": round(args.items / reverify, 1),
            "cache_hit_rate": round(hits / args.items, 3), "judge_calls_on_reverify": int(calls),
            "same_reward_on_reverify": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16, help="judge reply length (max_output_tokens)")
    parser.add_argument("--embedded", action="store_true", help="the embedded SmolLM2-135M instead of a tiny model")
    result = asyncio.run(run(parser.parse_args()))
    print(json.dumps(result, indent=1))
    print(f"judged /verify: {result['judged_verifies_per_s']}/s vs raw judge model {result['raw_per_s']}/s: "
          f"ratio {result['ratio']} (aim 0.8); re-verify cache hit rate {result['cache_hit_rate']} (aim 1.0)")


if __name__ == "__main__":
    main()
