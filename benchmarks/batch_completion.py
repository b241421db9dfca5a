"""Batch completion time: what a GRPO step waits for, the last rollout of its batch, against the ideal.

Run: `.venv/bin/python benchmarks/batch_completion.py [--envs math,code,instruction_following,blend]
[--prompts 64] [--generations 8] [--concurrency 64]`

Per environment (or `blend`: half math, a quarter each code and instruction_following),
`prompts x generations` rollouts (the mixed responses of `benchmarks/mixes.py`, one per
generation) go through the trainer client (`RolloutClient.run_many`, as the TRL rollout
function sends a batch) to `agents/simple_agent` over the stub policy (it answers each row's
scripted response instantly). Prints the time until the last rollout is done, and the ideal:
the CPU seconds every process (resource servers, their workers and sandboxed programs, agents,
stub model, and the client itself, which shares the cores) spent on the batch, divided by the
cores. `last / ideal` near 1 means no rollout was left waiting while a core idled; on a shared
machine other tenants' load shows as a larger ratio (the load average is printed). A check that
needs no accounting: the share of the machine's core time left idle between the first request and
the last rollout, from /proc/stat (on a quiet machine near 0 means the batch kept every core busy).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gymserve.testing import ServerProcess  # noqa: E402
from mixes import ENVS, mix  # noqa: E402
from trainer.client import RolloutClient, is_failure  # noqa: E402
from verify_math import cpu_seconds  # noqa: E402


def grpo_batch(env: str, prompts: int, generations: int) -> list[dict[str, Any]]:
    """`prompts` rows, each `generations` times with its own draw of a (scripted) response."""
    drawn = mix(env, prompts * generations, seed=1)
    by_row: dict[int, list[str]] = {}
    for row, text in drawn:
        by_row.setdefault(id(row), []).append(text)
    rows = []
    for p in range(prompts):
        row = drawn[p][0]
        texts = by_row[id(row)]
        for g in range(generations):
            text = texts[(p * generations + g) % len(texts)]
            params = dict(row["responses_create_params"], metadata={"stub_script": json.dumps([{"text": text}])})
            rows.append({**row, "responses_create_params": params, "agent_ref": {"name": f"{env_of(row)}_agent"},
                         "_ng_task_index": p, "_ng_rollout_index": g})
    return rows


def env_of(row: dict[str, Any]) -> str:
    return str(row["agent_ref"]["name"]).removesuffix("_simple_agent")


def idle_jiffies() -> tuple[int, int]:
    """(idle + iowait, total) core time of the whole machine so far, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return values[3] + values[4], sum(values[:8])


def stack_cpu(servers: list[ServerProcess]) -> float:
    """CPU seconds of the stack: each server, its live children (pool workers), and every
    descendant it has reaped (sandboxed programs), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for server in servers:
        if server.proc is None:
            continue
        fields = Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[13]) + int(fields[14])) / tick  # cutime + cstime: reaped children
        total += sum(cpu_seconds(server.proc.pid).values())
    return total


async def batches(client: RolloutClient, servers: list[ServerProcess], envs: list[str],
                  args: argparse.Namespace) -> None:
    cores = os.cpu_count() or 1
    async with client:
        await client.run_many(grpo_batch("blend", 8, 4))  # warm-up: imports, caches, connections
        for env in envs:
            rows = grpo_batch(env, args.prompts, args.generations)
            before, client_before, idle_before = stack_cpu(servers), time.process_time(), idle_jiffies()
            start = time.perf_counter()
            records = await client.run_many(rows)
            wall = time.perf_counter() - start
            idle_after = idle_jiffies()
            idle = (idle_after[0] - idle_before[0]) / max(1, idle_after[1] - idle_before[1])
            served, sent = stack_cpu(servers) - before, time.process_time() - client_before
            work = served + sent  # the client (this process) shares the cores with the stack
            failed = sum(is_failure(r) for r in records)
            kinds = collections.Counter(str(r.get("failure_kind")) for r in records if is_failure(r))
            ideal = work / cores
            print(f"{env:<22} last rollout {wall:6.2f} s  ideal {ideal:6.2f} s ({served:.2f} stack + {sent:.2f} client "
                  f"cpu-s / {cores} cores)  "
                  f"last/ideal {wall / ideal:4.2f}  cores idle {idle:4.0%}  failed {failed}/{len(records)} {dict(kinds) or ''}  "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="math,code,instruction_following,blend")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; batch {args.prompts} prompts x "
          f"{args.generations} generations, client concurrency {args.concurrency}", flush=True)
    with ExitStack() as stack:
        model = stack.enter_context(ServerProcess("models/stub", "text=unused", name="stub_policy"))
        servers, agents = [model], {}
        for env in ENVS:
            resource = stack.enter_context(ServerProcess(f"resources/{env}", name=env))
            agent = stack.enter_context(ServerProcess("agents/simple_agent", f"resources_url={resource.url}",
                                                      f"model_url={model.url}", name=f"{env}_agent"))
            servers += [resource, agent]
            agents[f"{env}_agent"] = agent.url
        client = RolloutClient(agents=agents, concurrency=args.concurrency, deadline_s=600, retries=0)
        asyncio.run(batches(client, servers, args.envs.split(","), args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
