"""Generation throughput of `models/hf` (continuous batching) against a raw batched transformers `generate`.

    .venv/bin/python benchmarks/model_hf.py [--model PATH] [--tokens 32] [--rounds 2] [--concurrency 1,8,32]

Starts the real server twice (the embedded SmolLM2-135M-Instruct by default): once with continuous
batching (the default) and once with `continuous_batching=false` (the static batching it replaced).
At each concurrency C it sends C concurrent chat requests per wave (different prompts, greedy,
same max tokens) and measures generated tokens/s over HTTP; the raw side runs the same prompts
through `model.generate` in-process as left-padded batches of C. Rounds are interleaved and the
best of each is kept, so load from other jobs on a shared machine hits every side alike.
Time to first token (streamed requests, median) is measured at each concurrency as well.
Prints tok/s, the ratio ours/raw per concurrency, and continuous/static.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gymserve.testing import ServerProcess  # noqa: E402

THINGS = ("cat", "robot", "river", "mountain", "teacher", "comet", "garden", "violin")
STYLES = ("short story", "poem", "letter", "song")
PROMPTS = [f"Write a {style} about a {thing}." for style in STYLES for thing in THINGS]  # 32 prompts


def _chat(prompt: str, tokens: int, **extra: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": tokens, **extra}


def serve_rate(client: httpx.Client, url: str, prompts: list[str], tokens: int, concurrency: int) -> float:
    def one(prompt: str) -> int:
        r = client.post(f"{url}/v1/chat/completions", json=_chat(prompt, tokens))
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        total = sum(pool.map(one, prompts))
    return total / (time.perf_counter() - start)


def time_to_first_token(client: httpx.Client, url: str, prompts: list[str], tokens: int,
                        concurrency: int) -> float:
    """Median seconds from sending a streamed request to its first content chunk, C requests at once."""
    def one(prompt: str) -> float:
        start = time.perf_counter()
        with client.stream("POST", f"{url}/v1/chat/completions", json=_chat(prompt, tokens, stream=True)) as r:
            r.raise_for_status()
            first = None
            for line in r.iter_lines():  # read it all, like a real client
                if first is None and line.startswith("data:") and '"content"' in line:
                    first = time.perf_counter() - start
        return first if first is not None else time.perf_counter() - start

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return statistics.median(pool.map(one, prompts[:concurrency]))


class RawGenerate:
    """The same model in-process, driven by `model.generate`: the limit without HTTP and queueing."""

    def __init__(self, folder: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from services.models.hf.service import default_threads

        torch.set_num_threads(default_threads())  # the server's thread count: a like-for-like comparison
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(str(folder))
        self.tok.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()

    def rate(self, prompts: list[str], tokens: int, batch: int) -> float:
        tok = self.tok
        texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                         add_generation_prompt=True) for p in prompts]
        total = 0
        start = time.perf_counter()
        with self.torch.inference_mode():
            for i in range(0, len(texts), batch):
                enc = tok(texts[i:i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
                out = self.model.generate(**enc, max_new_tokens=tokens, do_sample=False,
                                          pad_token_id=tok.pad_token_id)
                for row in out[:, enc["input_ids"].shape[1]:].tolist():  # up to the first end of turn, like ours
                    total += next((k + 1 for k, t in enumerate(row) if t == tok.eos_token_id), len(row))
        return total / (time.perf_counter() - start)


def report(c: int, rate: dict, ttft: dict, rounds: int) -> None:
    ours, static, raw = (max(rate[(side, c)]) for side in ("continuous", "static", "raw"))
    first = {side: min(ttft[(side, c)]) for side in ("continuous", "static")}
    print(f"concurrency {c:2d} ({rounds} round(s)): continuous {ours:6.1f} tok/s | static {static:6.1f} tok/s | "
          f"raw generate {raw:6.1f} tok/s | continuous/raw {ours / raw:.2f} (static/raw {static / raw:.2f}, "
          f"continuous/static {ours / static:.2f}) | time to first token continuous "
          f"{first['continuous'] * 1000:6.0f} ms, static {first['static'] * 1000:6.0f} ms", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="local model folder (default: the embedded SmolLM2)")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved measurement rounds (best of)")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated concurrency levels")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]

    from services.models.hf.embedded import embedded_model_dir

    folder = Path(args.model) if args.model else embedded_model_dir()
    options = [f"model={args.model}"] if args.model else []
    batch = f"max_batch_size={max(levels)}"
    raw = RawGenerate(folder)
    rate: dict[tuple[str, int], list[float]] = {}
    ttft: dict[tuple[str, int], list[float]] = {}
    with ServerProcess("models/hf", *options, batch, ready_timeout_s=600) as cont, \
            ServerProcess("models/hf", *options, batch, "continuous_batching=false", ready_timeout_s=600) as static, \
            httpx.Client(timeout=600, limits=httpx.Limits(max_connections=64)) as client:
        servers = {"continuous": cont.url, "static": static.url}
        for url in servers.values():
            serve_rate(client, url, PROMPTS[:2], 4, 2)  # warm-up
        raw.rate(PROMPTS[:2], 4, 2)
        print(f"model: {folder.name}, greedy, max_tokens={args.tokens}, interleaved rounds (best so far)", flush=True)
        for number in range(args.rounds):
            for c in levels:
                prompts = PROMPTS[:max(c, 4)] if c == 1 else PROMPTS[:c]  # batch 1: 4 sequential requests
                for name, url in servers.items():
                    rate.setdefault((name, c), []).append(serve_rate(client, url, prompts, args.tokens, c))
                    ttft.setdefault((name, c), []).append(time_to_first_token(client, url, prompts, args.tokens, c))
                rate.setdefault(("raw", c), []).append(raw.rate(prompts, args.tokens, c))
                report(c, rate, ttft, number + 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
