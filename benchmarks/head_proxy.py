"""The head's proxy and tail latency: math `/verify` direct vs through the head, side by side.

Run: `.venv/bin/python benchmarks/head_proxy.py [--items 3000] [--concurrency 64,256] [--slices 10]`

Starts one math server (`workers` pool processes) and a head whose stack points at it. Per
concurrency the items are driven straight at the server and through `/servers/math/verify` in
short slices that alternate which side goes first (as `versus_revision.py` does): this VM's
speed drifts by tens of percent within a minute, so two whole phases one after the other
compare the drift more than the sides. A minimal keep-alive client honours 503 + Retry-After.
Prints per side the throughput over all slices, p50/p99/max latency and p99/p50, the ratio
head/direct, the range of the per-slice ratios and p99/p50 (aim <= 4 at 64 and 256). Per side it
also prints where the cores went, in CPU ms per item
(from /proc): the proxy (the head), the math server's own process, its pool workers and this client, so a
gap between the sides can be read as the head's own work or as the servers' work growing
beside it. (A CPU-cheap front door is a real reverse proxy: docs/deployment/reverse-proxy.md.)
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gymserve.testing import ServerProcess, verify_body  # noqa: E402
from verify_math import cpu_seconds, drive, make_items, pct  # noqa: E402

PARTS = ("proxy", "math server", "math workers", "client")


def phase(port: int, path: str, bodies: list[bytes], concurrency: int) -> tuple[float, list[float]]:
    wall, lat, _ = asyncio.run(drive(port, path, bodies, concurrency))
    return wall, lat


SIDES = {"direct": "direct    ", "head": "via head  "}


def cpu_now(math_pid: int, proxy_pid: int) -> tuple[float, ...]:
    """CPU seconds so far of each of PARTS (the proxy of the side in the head's place)."""
    math, proxy = cpu_seconds(math_pid), cpu_seconds(proxy_pid)
    return proxy["server"], math["server"], math["workers"], time.process_time()


def summary(walls: list[float], lat: list[float], items: int) -> dict[str, Any]:
    return {"rate": items / sum(walls), "p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat)}


def show(label: str, r: dict[str, Any]) -> str:
    return (f"{label}: {r['rate']:7.1f} req/s  p50 {r['p50'] * 1000:7.1f} ms  p99 {r['p99'] * 1000:7.1f} ms  "
            f"max {r['max'] * 1000:7.1f} ms  p99/p50 {r['p99'] / r['p50']:4.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=3000)
    parser.add_argument("--concurrency", default="64,256")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--slices", type=int, default=10, help="alternations per concurrency")
    parser.add_argument("--server-option", action="append", default=[], help="extra key=value for the math server")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    bodies = [json.dumps(verify_body(text, expected_answer=expected)).encode()
              for text, expected in make_items(args.items)]
    print(f"load average {os.getloadavg()[0]:.1f}; items {len(bodies)}, math workers {args.workers}, "
          f"cpus {os.cpu_count()}")
    size = -(-len(bodies) // args.slices)
    with ServerProcess("resources/math", f"workers={args.workers}", *args.server_option) as math:
        spec = {"stack": {"servers": {"math": {"kind": "resources/math", "port": math.port}}}}
        with ServerProcess("head", env={"GYMSERVE_SERVER_SPEC": json.dumps(spec)}) as head:
            sides = {"direct": (math.port, "/verify"), "head": (head.port, "/servers/math/verify")}
            pids = {"direct": head.proc.pid, "head": head.proc.pid}  # type: ignore[union-attr]
            for side in sides.values():
                phase(*side, bodies[:200], 16)  # warm-up: parse caches, connections
            for c in levels:
                walls: dict[str, list[float]] = {side: [] for side in SIDES}
                lats: dict[str, list[float]] = {side: [] for side in SIDES}
                cpu = {side: [0.0] * len(PARTS) for side in SIDES}
                for k in range(args.slices):
                    part = bodies[k * size:(k + 1) * size]
                    for side in list(SIDES)[k % 2:] + list(SIDES)[:k % 2]:  # each side goes first in turn
                        before = cpu_now(math.proc.pid, pids[side])  # type: ignore[union-attr]
                        wall, lat = phase(*sides[side], part, c)
                        after = cpu_now(math.proc.pid, pids[side])  # type: ignore[union-attr]
                        cpu[side] = [t + b - a for t, a, b in zip(cpu[side], before, after)]
                        walls[side].append(wall)
                        lats[side] += lat
                results = {side: summary(walls[side], lats[side], len(bodies)) for side in SIDES}
                direct, via = results["direct"], results["head"]
                per_slice = sorted(d / h for d, h in zip(walls["direct"], walls["head"]))
                print(f"concurrency {c} ({args.slices} slices per side):")
                for side, label in SIDES.items():
                    print("  " + show(label, results[side]))
                print(f"  head/direct throughput {via['rate'] / direct['rate']:.2f} (slices "
                      f"{per_slice[0]:.2f} to {per_slice[-1]:.2f}); p99/p50 direct "
                      f"{direct['p99'] / direct['p50']:.1f}, via head {via['p99'] / via['p50']:.1f} (aim <= 4)")
                for side in SIDES:
                    per_item = [seconds / len(bodies) * 1000 for seconds in cpu[side]]
                    print(f"  CPU ms per item, {side:6}: " + ", ".join(
                        f"{name} {ms:.2f}" for name, ms in zip(PARTS, per_item)) + f"; all {sum(per_item):.2f}")
                print(flush=True)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
