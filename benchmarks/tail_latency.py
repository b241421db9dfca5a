"""Where the `/verify` tail comes from: the worker pool's dispatch, measured in-process, A/B in one run.

Run: `.venv/bin/python benchmarks/tail_latency.py [--items 1000] [--concurrency 64] [--workers N]`

The same math items (benchmarks/verify_math.py's mix) are scored through two `WorkerPool`s,
`concurrency` submitters at a time, no HTTP: (a) micro-batches of up to `max_batch` items per
worker whatever the item cost (the pool's previous dispatch), (b) micro-batches sized from the
measured item time (the current dispatch: slow items go one at a time). While each runs, a probe
measures event-loop lag (how late a 10 ms sleep wakes) and `gc` callbacks the time spent in
garbage collection, so the three suspects (dispatch, loop stalls, GC) are separated. Prints
p50/p99/max, p99/p50 and throughput for both, and b/a.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from services.core import pool as pool_module  # noqa: E402
from services.core.pool import WorkerPool  # noqa: E402
from services.resources.math import checker  # noqa: E402
from verify_math import make_items, pct  # noqa: E402


async def run(items: list[tuple[str, str]], workers: int, concurrency: int) -> dict[str, Any]:
    lag: list[float] = []
    gc_time = [0.0, 0.0]  # total, start of the current collection

    def on_gc(phase: str, _: dict) -> None:
        if phase == "start":
            gc_time[1] = time.perf_counter()
        else:
            gc_time[0] += time.perf_counter() - gc_time[1]

    async def probe() -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.01)
            lag.append(time.perf_counter() - t - 0.01)

    async with WorkerPool(workers, initializer=checker.init_worker, deadline_s=30) as pool:
        await pool.map(checker.score, [(t, e, 5) for t, e in items[:50]])  # warm-up
        latencies = [0.0] * len(items)
        order = iter(range(len(items)))

        async def submitter() -> None:
            for i in order:
                t = time.perf_counter()
                await pool.run(checker.score, items[i][0], items[i][1], 5)
                latencies[i] = time.perf_counter() - t

        watcher = asyncio.create_task(probe())
        gc.callbacks.append(on_gc)
        start = time.perf_counter()
        try:
            await asyncio.gather(*(submitter() for _ in range(concurrency)))
        finally:
            wall = time.perf_counter() - start
            gc.callbacks.remove(on_gc)
            watcher.cancel()
    return {"rate": len(items) / wall, "p50": pct(latencies, 50), "p99": pct(latencies, 99),
            "max": max(latencies), "lag_max": max(lag, default=0.0), "lag_p99": pct(lag, 99) if len(lag) > 1 else 0,
            "gc": gc_time[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    items = make_items(args.items)
    adaptive_target = pool_module._BATCH_TARGET_S
    print(f"load average {os.getloadavg()[0]:.1f}; {len(items)} items, {args.workers} workers, "
          f"concurrency {args.concurrency}")
    rows: dict[str, list[dict[str, Any]]] = {"fixed": [], "adaptive": []}
    for number in range(args.rounds):
        for name in ("fixed", "adaptive") if number % 2 == 0 else ("adaptive", "fixed"):
            # fixed: a batch target so large that every dispatch sends up to max_batch (16) items
            pool_module._BATCH_TARGET_S = 1e9 if name == "fixed" else adaptive_target
            rows[name].append(asyncio.run(run(items, args.workers, args.concurrency)))
    for name, label in (("fixed", "up to 16 items per message (before)"), ("adaptive", "cost-sized messages (now)")):
        r = min(rows[name], key=lambda x: x["p99"] / x["p50"])
        print(f"{label:38s}: {r['rate']:6.1f} items/s  p50 {r['p50'] * 1000:7.1f} ms  p99 {r['p99'] * 1000:7.1f} ms  "
              f"max {r['max'] * 1000:7.1f} ms  p99/p50 {r['p99'] / r['p50']:5.1f}  | loop lag p99 "
              f"{r['lag_p99'] * 1000:5.1f} ms max {r['lag_max'] * 1000:6.1f} ms | gc {r['gc'] * 1000:6.1f} ms total")
    fixed = max(r["rate"] for r in rows["fixed"])
    adaptive = max(r["rate"] for r in rows["adaptive"])
    print(f"throughput now/before {adaptive / fixed:.2f} (best rounds)")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
