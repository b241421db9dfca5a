"""The head's proxy and tail latency: math `/verify` direct vs through the head, side by side.

Run: `.venv/bin/python benchmarks/head_proxy.py [--items 2000] [--concurrency 64,256] [--rounds 2]`

Starts one math server (`workers` pool processes) and a head whose stack points at it. Each
round drives the same items at each concurrency straight at the server and through
`/servers/math/verify` (order alternating between rounds, so a shared machine's changing load
hits both alike) with a minimal keep-alive client that honours 503 + Retry-After. Prints
throughput, p50/p99/max latency, p99/p50, and the ratio head/direct per concurrency
(best round). Aims: head/direct >= 0.9 at concurrency 64; p99 <= 4x p50 at 64 and 256.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gymserve.testing import ServerProcess, verify_body  # noqa: E402
from verify_math import drive, make_items, pct  # noqa: E402


def phase(port: int, path: str, bodies: list[bytes], concurrency: int) -> dict[str, Any]:
    wall, lat, _ = asyncio.run(drive(port, path, bodies, concurrency))
    return {"rate": len(bodies) / wall, "p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat)}


def show(label: str, r: dict[str, Any]) -> str:
    return (f"{label}: {r['rate']:7.1f} req/s  p50 {r['p50'] * 1000:7.1f} ms  p99 {r['p99'] * 1000:7.1f} ms  "
            f"max {r['max'] * 1000:7.1f} ms  p99/p50 {r['p99'] / r['p50']:4.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--concurrency", default="64,256")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--server-option", action="append", default=[], help="extra key=value for the math server")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    bodies = [json.dumps(verify_body(text, expected_answer=expected)).encode()
              for text, expected in make_items(args.items)]
    print(f"load average {os.getloadavg()[0]:.1f}; items {len(bodies)}, math workers {args.workers}, "
          f"cpus {os.cpu_count()}")
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    with ServerProcess("resources/math", f"workers={args.workers}", *args.server_option) as math:
        spec = {"stack": {"servers": {"math": {"kind": "resources/math", "port": math.port}}}}
        with ServerProcess("head", env={"GYMSERVE_SERVER_SPEC": json.dumps(spec)}) as head:
            phase(math.port, "/verify", bodies[:200], 16)  # warm-up: parse caches, connections
            phase(head.port, "/servers/math/verify", bodies[:200], 16)
            for number in range(args.rounds):
                for c in levels:
                    sides = [("direct", math.port, "/verify"), ("head", head.port, "/servers/math/verify")]
                    for side, port, path in sides if number % 2 == 0 else reversed(sides):
                        results.setdefault((side, c), []).append(phase(port, path, bodies, c))
    for c in levels:
        best = max(range(args.rounds), key=lambda i: results[("head", c)][i]["rate"] / results[("direct", c)][i]["rate"])
        direct, via = results[("direct", c)][best], results[("head", c)][best]
        print(f"concurrency {c}:")
        print("  " + show("direct    ", direct))
        print("  " + show("via head  ", via))
        print(f"  head/direct throughput {via['rate'] / direct['rate']:.2f} (aim >= 0.9 at 64); p99/p50 direct "
              f"{direct['p99'] / direct['p50']:.1f}, via head {via['p99'] / via['p50']:.1f} (aim <= 4)")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
