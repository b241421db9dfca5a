"""Stateful sessions across replicas: what affinity and journals cost, and how many sessions fit.

Run: `.venv/bin/python benchmarks/sessions.py [--sessions 2000] [--calls 600] [--concurrency 32]`

Starts real `gymserve serve resources/workplace` processes on 127.0.0.1: two replicas sharing a
journal folder, and one plain server without journals (the one-replica reference). Prints, measured
in one run:

- seeding `--sessions` sessions through replica a (the less-loaded one takes its share): seeds/s,
  how many each replica holds, resident memory per open session per replica, journal bytes per session;
- per-call overhead of a tool call (`search_emails`), sequential, p50/p99: straight to the owner
  with its journal (what agents do) vs the plain server (aim: <= 1.1x), and through the wrong
  replica (forwarded once, what a caller that ignores `X-Gymserve-Replica` pays);
- throughput of tool calls at `--concurrency` over all sessions with 1 vs 2 replicas (on a 2-core
  machine the second replica has no core of its own, so this ratio is bounded by the cores).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gymserve.testing import ServerProcess  # noqa: E402
from services.core.affinity import REPLICA_HEADER  # noqa: E402
from services.resources.workplace.dataset import build_rows  # noqa: E402

ROW = build_rows()[0]
KEY = "bench-sessions-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def rss_kb(proc: ServerProcess) -> int:
    assert proc.proc is not None
    for line in Path(f"/proc/{proc.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def seed_many(client: httpx.AsyncClient, url: str, n: int, concurrency: int) -> list[tuple[str, str]]:
    sem = asyncio.Semaphore(concurrency)

    async def one() -> tuple[str, str]:
        async with sem:
            r = await client.post(f"{url}/seed_session", json=ROW)
            r.raise_for_status()
            return r.json()["session_id"], r.headers.get(REPLICA_HEADER, url)

    return list(await asyncio.gather(*(one() for _ in range(n))))


async def latencies(client: httpx.AsyncClient, targets: list[tuple[str, str]], calls: int) -> list[float]:
    out = []
    for i in range(calls):
        sid, url = targets[i % len(targets)]
        started = time.perf_counter()
        r = await client.post(f"{url}/search_emails", json={"query": "launch"}, headers={"X-Session-Id": sid})
        out.append(time.perf_counter() - started)
        r.raise_for_status()
    return out


async def throughput(client: httpx.AsyncClient, targets: list[tuple[str, str]], calls: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        sid, url = targets[i % len(targets)]
        async with sem:
            r = await client.post(f"{url}/search_emails", json={"query": "launch"}, headers={"X-Session-Id": sid})
            r.raise_for_status()

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(calls)))
    return calls / (time.perf_counter() - started)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def main(args: argparse.Namespace) -> None:
    env = {"GYMSERVE_API_KEY": KEY}
    with tempfile.TemporaryDirectory(prefix="gymserve-bench-sessions-") as store:
        with ServerProcess("resources/workplace", f"session_store={store}", f"max_sessions={args.sessions}",
                           name="wp_a", env=env) as a, \
                ServerProcess("resources/workplace", f"session_store={store}", f"max_sessions={args.sessions}",
                              name="wp_b", env=env) as b, \
                ServerProcess("resources/workplace", f"max_sessions={args.sessions}", name="wp_plain", env=env) as plain:
            limits = httpx.Limits(max_connections=args.concurrency * 2)
            async with httpx.AsyncClient(headers=AUTH, timeout=120, limits=limits) as client:
                rss_before = {a.url: rss_kb(a), b.url: rss_kb(b), plain.url: rss_kb(plain)}
                started = time.perf_counter()
                spread = await seed_many(client, a.url, args.sessions, args.concurrency)
                seed_rate = args.sessions / (time.perf_counter() - started)
                single = await seed_many(client, plain.url, args.sessions, args.concurrency)
                held = {url: sum(1 for _, owner in spread if owner == url) for url in (a.url, b.url)}
                journal_bytes = sum(p.stat().st_size for p in Path(store).glob("*.jsonl"))
                print(f"seeded {args.sessions} sessions through a: {seed_rate:.0f} seeds/s; held: a {held[a.url]}, "
                      f"b {held[b.url]}; journal {journal_bytes / args.sessions / 1024:.1f} KiB per session")
                for name, proc, count in (("a", a, held[a.url]), ("b", b, held[b.url]),
                                          ("plain", plain, args.sessions)):
                    grown = rss_kb(proc) - rss_before[proc.url]
                    print(f"  memory per open session, {name}: {grown / max(1, count):.1f} KiB "
                          f"(+{grown / 1024:.1f} MiB for {count})")
                direct = await latencies(client, spread, args.calls)
                reference = await latencies(client, single, args.calls)
                wrong = [(sid, b.url if owner == a.url else a.url) for sid, owner in spread]
                forwarded = await latencies(client, wrong, args.calls)
                for label, values in (("owner, journaled", direct), ("plain, one replica", reference),
                                      ("wrong replica, forwarded", forwarded)):
                    print(f"  tool call {label}: p50 {pct(values, 0.5):.2f} ms, p99 {pct(values, 0.99):.2f} ms")
                print(f"  ratio owner/plain: p50 {statistics.median(direct) / statistics.median(reference):.2f}x, "
                      f"p99 {pct(direct, 0.99) / pct(reference, 0.99):.2f}x (aim <= 1.1x)")
                two = await throughput(client, spread, args.calls * 4, args.concurrency)
                one = await throughput(client, single, args.calls * 4, args.concurrency)
                print(f"  throughput at concurrency {args.concurrency}: 2 replicas {two:.0f} calls/s, "
                      f"1 replica {one:.0f} calls/s, ratio {two / one:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=32)
    asyncio.run(main(parser.parse_args()))
