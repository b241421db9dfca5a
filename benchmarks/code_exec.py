"""Sandboxed executions/s of a trivial program at concurrency 8, and the sandbox's per-execution
overhead over a plain subprocess, as ratios measured in one run.

    .venv/bin/python benchmarks/code_exec.py [--concurrency 8] [--runs 200] [--row-tests 16] [--no-http]

Measures with the same interpreter, same program (`print(int(input()) + 1)`), same asyncio pipes:
(a) a plain `python -I -S -c ...` subprocess (no isolation at all: the floor),
(b) `Sandbox.run` cold (bubblewrap, namespaces, seccomp, rlimits, cgroups when root, started per run),
(c) `Sandbox.run` warm (a pre-started sandbox takes the program; the server's default),
each sequentially (latency) and at the given concurrency (throughput), interleaved; then (d) `/verify`
on a real `resources/code` server at the same concurrency, with one stdin/stdout test per request and
with `--row-tests` per request (a row's tests share one sandbox: test executions/s is the figure).
Started from another checkout's directory, (d) measures that checkout's server.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gymserve.testing import ServerProcess, verify_body  # noqa: E402
from services.resources.code.sandbox import Limits, Sandbox  # noqa: E402

PROGRAM = "print(int(input()) + 1)"


async def plain_run(python: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        python, "-I", "-S", "-c", PROGRAM, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={"PATH": "/usr/bin:/bin"},
        start_new_session=True)  # like the sandbox (own session, hence own scheduler autogroup)
    out, _ = await asyncio.wait_for(proc.communicate(b"41\n"), 60)  # nothing waits forever
    assert out == b"42\n", out


async def sandbox_run(sandbox: Sandbox, warm: bool) -> None:
    result = await asyncio.wait_for(sandbox.run(PROGRAM, b"41\n", Limits(), warm=warm), 60)
    assert result.stdout == "42\n" and result.exit_code == 0, result


async def measure(fns: dict[str, Callable[[], Awaitable[None]]], runs: int, concurrency: int,
                  rounds: int = 5) -> dict[str, tuple[float, float]]:
    """Per variant: (median sequential latency in ms, executions/s at `concurrency`).

    The variants are interleaved (A, B, A, B ... for latency; alternating bursts for throughput) so
    that load from other processes on a shared machine hits them alike and the ratios stay fair."""
    latencies: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(max(20, runs // 5)):
        for name, fn in fns.items():
            start = time.perf_counter()
            await fn()
            latencies[name].append(time.perf_counter() - start)
    busy = {name: 0.0 for name in fns}
    per_round = max(concurrency, runs // rounds)
    for _ in range(rounds):
        for name, fn in fns.items():
            todo = iter(range(per_round))

            async def worker(todo=todo, fn=fn) -> None:  # bound now: the loop moves on
                for _ in todo:
                    await fn()
            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            busy[name] += time.perf_counter() - start
    return {name: (statistics.median(latencies[name]) * 1000, per_round * rounds / busy[name]) for name in fns}


async def http_rate(runs: int, concurrency: int, tests: int = 1) -> float:
    """/verify requests/s, each a row of `tests` identical tests."""
    body = verify_body(f"```python\n{PROGRAM}\n```", tests=[{"input": "41\n", "output": "42"}] * tests)
    with ServerProcess("resources/code", f"max_concurrency={concurrency}") as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            todo = iter(range(runs))

            async def worker() -> None:
                for _ in todo:
                    reply = (await client.post("/verify", json=body)).json()
                    assert reply["reward"] == 1.0, reply
            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return runs / (time.perf_counter() - start)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--row-tests", type=int, default=16, help="tests per row of the second /verify run")
    parser.add_argument("--no-http", action="store_true", help="skip the /verify measurement")
    args = parser.parse_args()
    sandbox = Sandbox()
    await sandbox.start()
    try:
        await sandbox.prestart(Limits(), args.concurrency)
        found = await measure({"plain": lambda: plain_run(sandbox.python),
                               "cold": lambda: sandbox_run(sandbox, False),
                               "warm": lambda: sandbox_run(sandbox, True)}, args.runs, args.concurrency)
        (plain_ms, plain_rate), (box_ms, box_rate), (warm_ms, warm_rate) = found["plain"], found["cold"], found["warm"]
    finally:
        await sandbox.close()
    print(f"sandbox: {sandbox.describe()}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"plain subprocess : {plain_ms:7.1f} ms/exec sequential, {plain_rate:7.1f} exec/s at concurrency "
          f"{args.concurrency}")
    print(f"bubblewrap, cold : {box_ms:7.1f} ms/exec sequential, {box_rate:7.1f} exec/s at concurrency "
          f"{args.concurrency}")
    print(f"bubblewrap, warm : {warm_ms:7.1f} ms/exec sequential, {warm_rate:7.1f} exec/s at concurrency "
          f"{args.concurrency} (prestart={args.concurrency}, the server's default path)")
    print(f"sandbox overhead : cold +{box_ms - plain_ms:.1f} ms/exec ({box_ms / plain_ms:.2f}x plain latency), "
          f"warm {warm_ms - plain_ms:+.1f} ms/exec ({warm_ms / plain_ms:.2f}x); throughput ratio sandbox/plain = "
          f"{box_rate / plain_rate:.2f} cold, {warm_rate / plain_rate:.2f} warm")
    if not args.no_http:
        rate = await http_rate(args.runs, args.concurrency)
        print(f"/verify (1 test) : {rate:7.1f} req/s at concurrency {args.concurrency} "
              f"({rate / warm_rate:.2f}x the bare warm sandbox rate)")
        rows = max(args.concurrency, args.runs // args.row_tests)
        rate = await http_rate(rows, args.concurrency, args.row_tests)
        print(f"/verify ({args.row_tests} tests): {rate:7.1f} req/s at concurrency {args.concurrency} = "
              f"{rate * args.row_tests:.1f} test executions/s ({rate * args.row_tests / warm_rate:.2f}x the bare "
              "warm sandbox rate)")


if __name__ == "__main__":
    asyncio.run(main())
