"""Math `/verify` throughput of this checkout against an earlier revision, interleaved in slices.

Run: `.venv/bin/python benchmarks/versus_revision.py [--base REV] [--slices 8] [--concurrency 64,256] [--mix]`

A shared virtual machine's speed drifts by tens of percent from one minute to the next, more
than the difference between two revisions, so two runs one after the other say little. Here
the base revision is checked out in a temporary git worktree, one math server runs from each
tree side by side (an idle one costs nothing), and the items are driven at one server, then
the same items at the other, in short slices that alternate which goes first. Both see the
same drift; their ratio is the comparison. Prints per concurrency each side's throughput,
p99/p50 and CPU per request (server, workers) over all slices, and the ratio this checkout /
base. The worktree is removed at the end. `--mix` drives the realistic math mix of
`benchmarks/mixes.py` (example rows, long and wrong answers) instead of `verify_math.py`'s items.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gymserve.testing import ServerProcess, verify_body  # noqa: E402
from mixes import mix  # noqa: E402
from verify_math import cpu_seconds, drive, make_items, pct  # noqa: E402

BEFORE_PERFORMANCE_WORK = "d7e2d53^"  # the parent of the first commit of the fair-queueing work


def short_commit(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


@contextlib.contextmanager
def revision_tree(commit: str) -> Iterator[Path]:
    """`commit` checked out in a temporary git worktree (removed afterwards); a server started with
    `cwd=` there runs that revision's code (`python -m` imports from the working directory)."""
    with tempfile.TemporaryDirectory(prefix="gymserve-base-") as scratch:
        tree = Path(scratch) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), commit], cwd=ROOT, check=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def measure(servers: dict[str, ServerProcess], bodies: list[bytes], concurrency: int,
            slices: int) -> dict[str, dict[str, Any]]:
    """Every item at `concurrency` on each server, slice by slice (the order alternating)."""
    totals = {name: {"wall": 0.0, "latencies": [], "server": 0.0, "workers": 0.0} for name in servers}
    size = -(-len(bodies) // slices)
    for k in range(slices):
        part = bodies[k * size:(k + 1) * size]
        for name in (list(servers) if k % 2 == 0 else list(reversed(servers))):
            pid = servers[name].proc.pid  # type: ignore[union-attr]
            before = cpu_seconds(pid)
            wall, latencies, _ = asyncio.run(drive(servers[name].port, "/verify", part, concurrency))
            after = cpu_seconds(pid)
            side = totals[name]
            side["wall"] += wall
            side["latencies"] += latencies
            side["server"] += after["server"] - before["server"]
            side["workers"] += after["workers"] - before["workers"]
    n = len(bodies)
    return {name: {"rate": n / side["wall"], "p50": pct(side["latencies"], 50), "p99": pct(side["latencies"], 99),
                   "max": max(side["latencies"]),
                   "server_ms": side["server"] / n * 1000, "workers_ms": side["workers"] / n * 1000}
            for name, side in totals.items()}


def show(label: str, r: dict[str, Any]) -> str:
    return (f"{label} {r['rate']:6.1f} req/s  p50 {r['p50'] * 1000:.0f} ms  p99 {r['p99'] * 1000:.0f} ms  "
            f"max {r['max'] * 1000:.0f} ms  p99/p50 {r['p99'] / r['p50']:4.1f}  cpu/req server "
            f"{r['server_ms']:.2f} ms + workers {r['workers_ms']:.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=BEFORE_PERFORMANCE_WORK,
                        help="git revision to compare against (default: the code before the performance work)")
    parser.add_argument("--slices", type=int, default=8, help="alternations per concurrency")
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--concurrency", default="64,256")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--mix", action="store_true", help="the realistic math mix (benchmarks/mixes.py)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    items = [(text, row["expected_answer"]) for row, text in mix("math", args.items)] if args.mix \
        else make_items(args.items)
    bodies = [json.dumps(verify_body(text, expected_answer=expected)).encode() for text, expected in items]
    commit = short_commit(args.base)
    print(f"this checkout vs {args.base} ({commit}); {len(bodies)} items in {args.slices} slices per side, "
          f"math workers {args.workers}, cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    with revision_tree(commit) as base:
        with ServerProcess("resources/math", f"workers={args.workers}", name="ours", cwd=ROOT) as ours, \
                ServerProcess("resources/math", f"workers={args.workers}", name="base", cwd=base) as theirs:
            servers = {"ours": ours, "base": theirs}
            for server in servers.values():  # warm-up: parse caches, connections
                asyncio.run(drive(server.port, "/verify", bodies[:200], 16))
            for c in levels:
                result = measure(servers, bodies, c, args.slices)
                print(f"concurrency {c}: {show('ours', result['ours'])} | {show('base', result['base'])} | "
                      f"ratio ours/base {result['ours']['rate'] / result['base']['rate']:.2f} (aim: at least 0.90)",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
