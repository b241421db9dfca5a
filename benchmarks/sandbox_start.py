"""Time from `POST /seed_session` to the first command's reply in a workspace, and SWE verifies per
minute, on real `resources/swe` servers.

    .venv/bin/python benchmarks/sandbox_start.py [--samples 8] [--verifies 16] [--docker-image TAG]

Start-up (median of `--samples` sequential sessions, each `/seed_session` then `POST /bash echo ok`):
(a) bwrap, no warm pool (the folder is copied and snapshotted per session), (b) bwrap with a warm
pool, (c) docker, cold container, (d) docker, warm-pool container; a pause between samples lets the
pool refill, as between rollouts. Throughput: `/verify` of the gold patch (each in a fresh
workspace: apply, test patch, pytest) at concurrency 2 and 8, per provider. Docker rows need
`--docker-image` (the tag `deploy/docker/sandbox.sh` prints) and a running engine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gymserve.testing import ServerProcess, verify_body  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ROWS = [json.loads(line) for line in (ROOT / "datasets/swe/example.jsonl").read_text().splitlines()]


def gold_body(row: dict[str, Any]) -> dict[str, Any]:
    fields = {k: v for k, v in row.items() if k != "responses_create_params"}
    return verify_body(f"```diff\n{row['patch']}```", responses_create_params=row["responses_create_params"], **fields)


def start_latency(server: ServerProcess, samples: int, pause_s: float) -> float:
    times = []
    with httpx.Client(timeout=300) as client:
        for _ in range(samples):
            time.sleep(pause_s)
            t0 = time.perf_counter()
            sid = client.post(f"{server.url}/seed_session", json=ROWS[0]).json()["session_id"]
            out = client.post(f"{server.url}/bash", json={"command": "echo ok"}, headers={"X-Session-Id": sid}).json()
            times.append(time.perf_counter() - t0)
            assert out["stdout"] == "ok\n", out
            client.post(f"{server.url}/close_session", json={}, headers={"X-Session-Id": sid})
    return statistics.median(times) * 1000


async def verifies_per_minute(server: ServerProcess, total: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as client:
        async def one(i: int) -> None:
            async with gate:
                reply = (await client.post(f"{server.url}/verify", json=gold_body(ROWS[i % len(ROWS)]))).json()
                assert reply["reward"] == 1.0, reply
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(total)))
        return total / (time.perf_counter() - t0) * 60


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--verifies", type=int, default=16)
    ap.add_argument("--pause", type=float, default=1.5, help="seconds between start-up samples (pool refill)")
    ap.add_argument("--docker-image", help="workspace image tag; without it the docker rows are skipped")
    args = ap.parse_args()
    where = Path(tempfile.mkdtemp(prefix="gymserve-bench-ws-"))
    where.chmod(0o755)
    env = {"GYMSERVE_SANDBOX_DIR": str(where)}
    setups = [("bwrap", "cold", ["warm_pool=0"]), ("bwrap", "warm pool", ["warm_pool=2"])]
    if args.docker_image:
        docker = ["sandbox_provider=docker", f"sandbox_image={args.docker_image}"]
        setups += [("docker", "cold container", [*docker, "warm_pool=0"]),
                   ("docker", "warm-pool container", [*docker, "warm_pool=2"])]
    results: dict[str, float] = {}
    try:
        for provider, label, options in setups:
            with ServerProcess("resources/swe", *options, env=env, ready_timeout_s=300) as server:
                time.sleep(args.pause)
                ms = start_latency(server, args.samples, args.pause)
                results[f"{provider}, {label}"] = ms
                print(f"seed_session -> first command, {provider}, {label}: {ms:.0f} ms (median of {args.samples})",
                      flush=True)
                if label == "cold" or label == "cold container":
                    for concurrency in (2, 8):
                        rate = asyncio.run(verifies_per_minute(server, args.verifies, concurrency))
                        print(f"swe /verify (gold patch, fresh workspace), {provider}, concurrency {concurrency}: "
                              f"{rate:.0f} verifies/min", flush=True)
        if "docker, warm-pool container" in results:
            print(f"warm-pool container / bwrap warm pool: "
                  f"{results['docker, warm-pool container'] / results['bwrap, warm pool']:.2f}x; "
                  f"/ bwrap cold: {results['docker, warm-pool container'] / results['bwrap, cold']:.2f}x")
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main()
