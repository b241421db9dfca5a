"""Rollouts/s of agent `/run` with a zero-latency model upstream, as a ratio to `/verify` alone.

    .venv/bin/python benchmarks/agent_run.py [--env exact_match] [--concurrency 64] [--requests 1500]
    .venv/bin/python benchmarks/agent_run.py --via-head --base REV   # this checkout vs REV, one run

Starts real servers on 127.0.0.1: `models/stub` (answers a fixed text instantly: the cost of
our stack, not of a model), the resource server, and `agents/simple_agent`. Measures, in one
run, (a) full `/run` rollouts (seed session, model call, verify, close session) and (b) direct
`/verify` calls on the same resource server, both at the same concurrency, and prints both
rates and their ratio. For scale: NeMo-Gym's full `/run` path does about 22 rollouts/s on the
development machine (2 cores).

`--via-head` adds a head whose stack lists the three servers, and every call goes through its
directory (`/servers/<name>/...`): the client's `/run`, and the agent's calls to the model and the
resource server. `--base REV` runs a second such stack from `REV` (a temporary git worktree) and
alternates rounds between the two, so a shared machine's drift hits both; it prints the `/run`
rate of each and ours / base.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Iterator

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gymserve.testing import ServerProcess, verify_body  # noqa: E402
from services.core.ports import free_port  # noqa: E402

ROWS = {
    "exact_match": ({"responses_create_params": {"input": [{"role": "user", "content": "What is 6 x 7?"}]},
                     "expected_answer": "42"}, "42"),
    "math": ({"responses_create_params": {"input": [{"role": "user", "content": "What is 6 x 7?"}]},
              "expected_answer": "42"}, "The answer is \\boxed{42}"),
}


async def hammer(url: str, body: dict, total: int, concurrency: int) -> tuple[float, int, int]:
    """`total` POSTs at `concurrency`; returns (seconds, ok replies, scored-1 replies).

    The load generator shares the machine with the servers, so it uses the cheapest client
    at hand (aiohttp) to steal as little CPU as possible from what is measured.
    """
    ok = rewarded = 0
    queue = iter(range(total))
    payload = json.dumps(body).encode()
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers={"Content-Type": "application/json"},
                                     timeout=aiohttp.ClientTimeout(total=120)) as client:
        async def worker() -> None:
            nonlocal ok, rewarded
            for _ in queue:
                async with client.post(url, data=payload) as r:
                    if r.status == 200:
                        data = json.loads(await r.read())
                        ok += not data.get("mask_sample")
                        rewarded += data.get("reward") == 1.0
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - start, ok, rewarded


@contextlib.contextmanager
def stack(env: str, answer: str, *, via_head: bool, cwd: Path = ROOT) -> Iterator[tuple[str, str]]:
    """The three servers (and a head in front of them with `via_head`) running the code in `cwd`;
    yields the `/run` URL and the resource server's `/verify` URL."""
    head_port = free_port()
    head = f"http://127.0.0.1:{head_port}"
    agent_name = f"{env}_simple_agent"
    with ServerProcess("models/stub", f"text={answer}", name="stub_model", cwd=cwd) as model, \
            ServerProcess(f"resources/{env}", name=env, cwd=cwd) as resource:
        resources_url, model_url = (f"{head}/servers/{env}", f"{head}/servers/stub_model") if via_head \
            else (resource.url, model.url)
        with ServerProcess("agents/simple_agent", f"resources_url={resources_url}", f"model_url={model_url}",
                           name=agent_name, cwd=cwd) as agent:
            if not via_head:
                yield f"{agent.url}/run", f"{resource.url}/verify"
                return
            servers = {"stub_model": {"kind": "models/stub", "port": model.port},
                       env: {"kind": f"resources/{env}", "port": resource.port},
                       agent_name: {"kind": "agents/simple_agent", "port": agent.port}}
            spec = {"stack": {"servers": servers}}
            with ServerProcess("head", name="head", port=head_port, cwd=cwd,
                               env={"GYMSERVE_SERVER_SPEC": json.dumps(spec)}):
                yield f"{head}/servers/{agent_name}/run", f"{resource.url}/verify"


def versus(args: argparse.Namespace, row: dict, answer: str) -> int:
    """`/run` of this checkout and of `args.base`, rounds alternating."""
    from versus_revision import revision_tree, short_commit

    commit = short_commit(args.base)
    rates = {"ours": 0.0, "base": 0.0}
    with revision_tree(commit) as tree, \
            stack(args.env, answer, via_head=args.via_head) as (ours, _), \
            stack(args.env, answer, via_head=args.via_head, cwd=tree) as (base, _):
        urls = {"ours": ours, "base": base}
        warm = max(args.concurrency, args.requests // 10)
        for url in urls.values():
            asyncio.run(hammer(url, row, warm, args.concurrency))
        for k in range(args.rounds):
            for side in (["ours", "base"] if k % 2 == 0 else ["base", "ours"]):
                seconds, ok, hits = asyncio.run(hammer(urls[side], row, args.requests, args.concurrency))
                if ok != args.requests or hits != args.requests:
                    print(f"FAILED: {side} /run ok={ok} reward1={hits} of {args.requests}")
                    return 1
                rates[side] = max(rates[side], args.requests / seconds)
    where = "through the head" if args.via_head else "direct"
    print(f"env={args.env} concurrency={args.concurrency} requests={args.requests} x {args.rounds} rounds (best), "
          f"/run {where}")
    print(f"this checkout: {rates['ours']:8.1f} rollouts/s")
    print(f"base {commit}: {rates['base']:8.1f} rollouts/s")
    print(f"ours / base = {rates['ours'] / rates['base']:.2f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", choices=sorted(ROWS), default="exact_match")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=1000, help="requests per measurement round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best of each is kept")
    parser.add_argument("--via-head", action="store_true", help="every call through a head's directory")
    parser.add_argument("--base", default=None, help="also run REV's code and compare (/run only)")
    args = parser.parse_args()
    row, answer = ROWS[args.env]
    if args.base:
        return versus(args, row, answer)
    with stack(args.env, answer, via_head=args.via_head) as (run_url, verify_url):
        verify = verify_body(answer, **{k: v for k, v in row.items() if k != "responses_create_params"})
        warm = max(args.concurrency, args.requests // 10)
        asyncio.run(hammer(run_url, row, warm, args.concurrency))
        asyncio.run(hammer(verify_url, verify, warm, args.concurrency))
        # Interleaved rounds, best of each: the machine is shared, so a burst of someone else's work
        # hits both measurements alike instead of one of them.
        run_rate = ver_rate = 0.0
        run_ok = run_hits = ver_ok = args.requests
        for _ in range(args.rounds):
            run_s, ok, hits = asyncio.run(hammer(run_url, row, args.requests, args.concurrency))
            run_rate, run_ok, run_hits = max(run_rate, args.requests / run_s), min(run_ok, ok), min(run_hits, hits)
            ver_s, ok, _ = asyncio.run(hammer(verify_url, verify, args.requests, args.concurrency))
            ver_rate, ver_ok = max(ver_rate, args.requests / ver_s), min(ver_ok, ok)
    if run_ok != args.requests or ver_ok != args.requests or run_hits != args.requests:
        print(f"FAILED: /run ok={run_ok} reward1={run_hits}, /verify ok={ver_ok} of {args.requests}")
        return 1
    print(f"env={args.env} concurrency={args.concurrency} requests={args.requests} x {args.rounds} rounds (best)")
    print(f"/run (seed + stub model + verify):         {run_rate:8.1f} rollouts/s")
    print(f"/verify alone:                            {ver_rate:8.1f} verifies/s")
    print(f"ratio /run : /verify = {run_rate / ver_rate:.2f}  (NeMo-Gym /run: ~22 rollouts/s on this machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
