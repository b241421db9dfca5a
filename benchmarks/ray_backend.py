"""Process backend vs Ray backend: the same stack, the same requests through the same head.

    .venv/bin/python benchmarks/ray_backend.py [--requests 400] [--concurrency 32] [--rounds 2]

Starts `gymserve up` (one process per server) and measures math `POST /verify` and the agent's
`POST /run` (simple_agent + the instant `models/stub` policy + math) through the head's proxy;
stops it; starts `gymserve up --backend ray` with the same stack (one replica each, a local
Ray) and measures the same. Prints each rate (median of the rounds) and ray/process ratios.
With the Ray backend every hop also crosses Serve's HTTP proxy and a replica actor, so the
ratio is the price of Ray's scale-out plumbing on one machine.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.core.client import ServiceClient  # noqa: E402
from gymserve.testing import verify_body  # noqa: E402
from tests.integration.up_helpers import Up  # noqa: E402

STACK = {
    "head": {"host": "127.0.0.1", "port": 0},
    "servers": {
        "math": {"kind": "resources/math", "workers": 1, "num_cpus": 0},
        "policy": {"kind": "models/stub", "text": "The answer is \\boxed{4}.", "num_cpus": 0},
        "agent": {"kind": "agents/simple_agent", "resources_server": "math", "model_server": "policy",
                  "num_cpus": 0},
    },
}
VERIFY = verify_body("\\boxed{4}", expected_answer="4")
RUN = {"responses_create_params": {"input": [{"role": "user", "content": "2+2?"}]}, "expected_answer": "4"}


async def rate(url: str, body: dict, n: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)
    http = ServiceClient(max_connections=concurrency, retries=0)
    try:
        async def one() -> None:
            async with sem:
                reply = await http.request("POST", url, json=body, deadline_s=120)
                assert reply.status_code == 200 and reply.json()["reward"] == 1.0, reply.text[:300]

        await asyncio.gather(*(one() for _ in range(concurrency)))  # warm connections and replicas
        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return n / (time.perf_counter() - start)
    finally:
        await http.aclose()


def measure(args: argparse.Namespace, stack_file: str, extra: list[str]) -> dict[str, float]:
    up = Up("-c", stack_file, *extra, "--ready-timeout", "300")
    try:
        up.wait_for(r"all 4 servers ready", timeout_s=400)
        head = up.wait_for(r"head: (http://\S+)").group(1)
        out: dict[str, list[float]] = {"verify": [], "run": []}
        for _ in range(args.rounds):
            out["verify"].append(asyncio.run(rate(f"{head}/servers/math/verify", VERIFY, args.requests,
                                                  args.concurrency)))
            out["run"].append(asyncio.run(rate(f"{head}/servers/agent/run", RUN, args.requests, args.concurrency)))
        return {k: statistics.median(v) for k, v in out.items()}
    finally:
        if up.proc.poll() is None:
            os.killpg(up.proc.pid, signal.SIGINT)
            try:
                up.wait(120)
            except Exception:
                up.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    temp = tempfile.mkdtemp(prefix="gsbench")
    try:
        stack_file = os.path.join(temp, "stack.yaml")
        Path(stack_file).write_text(yaml.safe_dump(STACK))
        process = measure(args, stack_file, [])
        ray = measure(args, stack_file, ["--backend", "ray", "--ray-temp-dir", os.path.join(temp, "ray")])
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    print(f"{args.requests} requests x {args.rounds} rounds, concurrency {args.concurrency}, through the head")
    for key, label in (("verify", "math POST /verify"), ("run", "agent POST /run (stub model + math)")):
        print(f"{label:38s} process {process[key]:8.1f}/s   ray {ray[key]:8.1f}/s   "
              f"ray/process {ray[key] / process[key]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
