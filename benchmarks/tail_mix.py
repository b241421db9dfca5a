"""Tail latency on realistic mixes: `/verify` direct and through the head, and agent `/run` with the stub policy.

Run: `.venv/bin/python benchmarks/tail_mix.py [--envs math,code,instruction_following] [--items 600]
[--concurrency 64,256]`

Items are drawn from `benchmarks/mixes.py` (the example rows of each environment with correct,
wrong, unanswered and long responses in training-like proportions), not one repeated item.
Starts, per environment, the resource server, a head whose stack points at it, the stub model
(it answers each row's scripted response instantly: the cost of our stack, not of a model)
and `agents/simple_agent`. For each concurrency, direct and through-the-head `/verify` run
back to back, the order alternating, so a shared machine's load hits both alike. Every distinct
item is verified once before the phases (its first-encounter cost: the slowest is printed), so
each phase meets the same warm caches and the phases measure scheduling, not which one saw an
item first. Prints p50, p99, max, p99/p50 and throughput per phase, and the load average.
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
from mixes import mix  # noqa: E402
from verify_math import drive, pct  # noqa: E402


def verify_bodies(env: str, n: int) -> list[bytes]:
    fields = lambda row: {k: v for k, v in row.items() if k not in ("responses_create_params", "agent_ref")}  # noqa: E731
    return [json.dumps(verify_body(text, **fields(row))).encode() for row, text in mix(env, n)]


def run_bodies(env: str, n: int) -> list[bytes]:
    """Agent `/run` rows whose (stub) policy answers with the mixed response."""
    out = []
    for row, text in mix(env, n):
        params = dict(row["responses_create_params"], metadata={"stub_script": json.dumps([{"text": text}])})
        out.append(json.dumps({**{k: v for k, v in row.items() if k != "agent_ref"},
                               "responses_create_params": params}).encode())
    return out


def phase(port: int, path: str, bodies: list[bytes], concurrency: int) -> dict[str, Any]:
    wall, lat, _ = asyncio.run(drive(port, path, bodies, concurrency))
    return {"rate": len(bodies) / wall, "p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat)}


def show(label: str, r: dict[str, Any]) -> str:
    return (f"  {label:<16} p50 {r['p50'] * 1000:7.1f} ms  p99 {r['p99'] * 1000:7.1f} ms  max {r['max'] * 1000:7.1f} ms"
            f"  p99/p50 {r['p99'] / r['p50']:4.1f}  {r['rate']:7.1f} req/s")


def bench_env(env: str, args: argparse.Namespace, levels: list[int]) -> None:
    verify = verify_bodies(env, args.items)
    runs = run_bodies(env, args.items)
    with ServerProcess(f"resources/{env}", name=env) as server, \
            ServerProcess("models/stub", "text=unused", name="stub_policy") as model, \
            ServerProcess("agents/simple_agent", f"resources_url={server.url}", f"model_url={model.url}",
                          name=f"{env}_simple_agent") as agent:
        spec = {"stack": {"servers": {env: {"kind": f"resources/{env}", "port": server.port}}}}
        with ServerProcess("head", env={"GYMSERVE_SERVER_SPEC": json.dumps(spec)}) as head:
            sides = [("direct /verify", server.port, "/verify"), ("head /verify", head.port, f"/servers/{env}/verify")]
            distinct = list(dict.fromkeys(verify))
            first = phase(server.port, "/verify", distinct, 16)  # every distinct item once: its first encounter
            print(f"{env}: {len(distinct)} distinct items verified once first (concurrency 16): slowest "
                  f"{first['max'] * 1000:.0f} ms, p99 {first['p99'] * 1000:.0f} ms", flush=True)
            for _, port, path in sides:  # warm-up: connections
                phase(port, path, verify[:100], 16)
            phase(agent.port, "/run", runs[:50], 16)
            print(f"{env}: {len(verify)} items, load average {os.getloadavg()[0]:.1f}", flush=True)
            for k, c in enumerate(levels):
                for label, port, path in (sides if k % 2 == 0 else list(reversed(sides))):
                    print(f"  c={c:<4}" + show(label, phase(port, path, verify, c)), flush=True)
                print(f"  c={c:<4}" + show("agent /run", phase(agent.port, "/run", runs, c)), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="math,code,instruction_following")
    parser.add_argument("--items", type=int, default=600, help="items per phase")
    parser.add_argument("--concurrency", default="64,256")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f} (a shared machine: compare sides of "
          "one run, not runs)")
    for env in args.envs.split(","):
        bench_env(env, args, levels)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
