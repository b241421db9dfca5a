"""Throughput of the math environment: `/verify` and `/verify/batch` vs math-verify in-process.

Run: `.venv/bin/python benchmarks/verify_math.py [--items 2000] [--concurrency 64] [--workers N]`

The limit is math-verify called in-process (a fresh interpreter, same items, same order,
one core) times the number of pool workers: what the workers could do if HTTP, JSON,
validation and IPC were free. Each phase gets a freshly started server so that no phase
profits from math-verify's parse caches warmed by an earlier one. The client is a minimal
keep-alive HTTP/1.1 client over asyncio streams so that it takes little CPU from the
server it measures (client and server share this machine's cores).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gymserve.testing import ServerProcess, verify_body  # noqa: E402

REASONING = [
    "First, let's restate the problem. We are told that {a} apples are shared among friends. ",
    "Multiplying both sides by {b} gives $x \\cdot {b} = {c}$, so we continue. ",
    "Note that $({a} + {b})^2 = {a}^2 + 2\\cdot{a}\\cdot{b} + {b}^2$. ",
    "We check the small cases: n = 1, 2, 3 give {a}, {b} and {c} respectively. ",
    "Hmm, wait. Let me double check the arithmetic: {a} * {b} = {c}. ",
]


def make_items(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """(response text, expected_answer) pairs: correct, wrong, equivalent forms, messy text, no answer."""
    rng = random.Random(seed)
    items = []
    for i in range(n):
        a, b = rng.randint(2, 999), rng.randint(2, 99)
        c = a * b
        kind = i % 8
        steps = "".join(rng.choice(REASONING).format(a=a, b=b, c=c) for _ in range(rng.randint(1, 4)))
        if kind == 0:
            items.append((f"{steps}Therefore the answer is $\\boxed{{{c}}}$.", str(c)))
        elif kind == 1:
            items.append((f"{steps}So the final answer is \\boxed{{{c + rng.randint(1, 9)}}}.", str(c)))
        elif kind == 2:
            items.append((f"{steps}The probability is $\\boxed{{\\frac{{{a}}}{{{a * b}}}}}$.", f"\\frac{{1}}{{{b}}}"))
        elif kind == 3:
            items.append((f"{steps}The answer is {1 / b:.6f}", f"\\frac{{1}}{{{b}}}"))
        elif kind == 4:
            items.append((f"{steps}Expanding, the result is $x^2 + {2 * b}x + {b * b}$.", f"(x+{b})^2"))
        elif kind == 5:
            items.append((f"{steps}Final answer: {c} dollars", f"{c}"))
        elif kind == 6:
            items.append((f"{steps}I am not sure how to finish this one.", str(c)))
        else:
            items.append((f"{steps}We get $\\boxed{{\\sqrt{{{b * b * 2}}}}}$", f"{b}\\sqrt{{2}}"))
    return items


# --------------------------------------------------------------------------- #
# in-process limit
# --------------------------------------------------------------------------- #
LIMIT_CODE = """
import json, os, sys, time
from services.resources.math import checker
checker.init_worker()  # same warm-up as a pool worker
items, workers = json.load(sys.stdin)

def run(part):
    start, cpu = time.perf_counter(), time.process_time()
    rewards = [checker.score(text, expected, 5)[0] for text, expected in part]
    return time.perf_counter() - start, time.process_time() - cpu, rewards

# `workers` forked copies score a share each: the limit realised, under the machine's real load
start, pipes = time.perf_counter(), []
for i in range(workers):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        with os.fdopen(w, "w") as out:
            out.write(json.dumps(run(items[i::workers])))
        os._exit(0)
    os.close(w)
    pipes.append(r)
parts = [json.loads(os.fdopen(r).read()) for r in pipes]
for _ in pipes:
    os.wait()
parallel = time.perf_counter() - start
seconds, cpu, rewards = run(items)  # one sequential pass in the parent: the literal single-core rate
print(json.dumps({"seconds": seconds, "cpu": cpu, "rewards": rewards, "parallel": parallel}))
"""


def in_process(items: list[tuple[str, str]], workers: int) -> dict[str, Any]:
    """math-verify in-process on the same items: one sequential pass, and `workers` forked copies in
    parallel. Its own session, like the server's, so the kernel's autogroup scheduling treats both alike."""
    out = subprocess.run([sys.executable, "-c", LIMIT_CODE], input=json.dumps([items, workers]),
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         check=True, start_new_session=True)
    return json.loads(out.stdout)


# --------------------------------------------------------------------------- #
# minimal keep-alive HTTP/1.1 client
# --------------------------------------------------------------------------- #
class Conn:
    def __init__(self, port: int, key: str | None = None) -> None:
        self.port = port
        self.extra = f"Authorization: Bearer {key}\r\n".encode() if key else b""
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.retry_after = 0.0  # Retry-After of the last reply (503 from a full queue)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n%s"
                          b"Content-Length: %d\r\n\r\n%s" % (path.encode(), self.extra, len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        self.retry_after = 0.0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
            elif line.lower().startswith(b"retry-after:"):
                self.retry_after = float(line.split(b":", 1)[1])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer:
            self.writer.close()


async def drive(port: int, path: str, bodies: list[bytes], concurrency: int,
                key: str | None = None) -> tuple[float, list[float], list[bytes]]:
    latencies: list[float] = [0.0] * len(bodies)
    replies: list[bytes] = [b""] * len(bodies)
    next_index = iter(range(len(bodies)))

    async def worker() -> None:
        conn = Conn(port, key)
        try:
            for i in next_index:
                t = time.perf_counter()
                status, payload = await conn.post(path, bodies[i])
                while status == 503 and conn.retry_after:  # a full queue: come back when it says
                    await asyncio.sleep(conn.retry_after)
                    status, payload = await conn.post(path, bodies[i])
                latencies[i] = time.perf_counter() - t
                if status != 200:
                    raise RuntimeError(f"{path} answered {status}: {payload[:300]!r}")
                replies[i] = payload
        finally:
            conn.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start, latencies, replies


def cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds used so far by the server process and by its worker processes."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"server": 0.0, "workers": 0.0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid, used = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
        if int(entry.name) == pid:
            out["server"] += used
        elif ppid == pid:
            out["workers"] += used
    return out


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


def run_phase(server: ServerProcess, phase: str, bodies: list[bytes], batches: list[bytes],
              args: argparse.Namespace) -> dict[str, Any]:
    assert server.proc is not None
    cpu_before = cpu_seconds(server.proc.pid)
    if phase == "single":
        wall, lat, replies = asyncio.run(drive(server.port, "/verify", bodies, args.concurrency))
        rewards = [json.loads(r)["reward"] for r in replies]
    else:
        wall, lat, replies = asyncio.run(drive(server.port, "/verify/batch", batches, args.batch_concurrency))
        rewards = [x["reward"] for r in replies for x in json.loads(r)]
    cpu_after = cpu_seconds(server.proc.pid)
    return {"rate": len(bodies) / wall, "p50": pct(lat, 50), "p99": pct(lat, 99), "rewards": rewards,
            "cpu": {k: cpu_after[k] - cpu_before[k] for k in cpu_after}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--batch-concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of (limit, /verify, /verify/batch); each round's ratios use that round's "
                             "limit, so a shared machine's changing load hits both sides alike")
    parser.add_argument("--server-option", action="append", default=[], help="extra key=value for the server")
    args = parser.parse_args()

    items = make_items(args.items)
    n = len(items)
    bodies = [json.dumps(verify_body(text, expected_answer=expected)).encode() for text, expected in items]
    batches = [b"[" + b",".join(bodies[k:k + args.batch_size]) + b"]" for k in range(0, n, args.batch_size)]
    print(f"load average {os.getloadavg()[0]:.1f} (other work on this machine skews the throughput ratios; "
          f"the cpu efficiency figures are robust to it)")
    print(f"items: {n}, workers: {args.workers}, cpus: {os.cpu_count()}, /verify at concurrency "
          f"{args.concurrency}, /verify/batch as {len(batches)} batches of {args.batch_size} "
          f"({args.batch_concurrency} in flight)")
    rounds = []
    for number in range(1, args.rounds + 1):
        limit_run = in_process(items, args.workers)
        seconds, cpu_in_process, expected_rewards = limit_run["seconds"], limit_run["cpu"], limit_run["rewards"]
        limit = n / seconds * args.workers  # the definition: single-core rate x workers
        realised = n / limit_run["parallel"]  # the same, run as `workers` parallel processes
        row: dict[str, Any] = {"limit": limit, "realised": realised}
        order = ("single", "batch") if number % 2 else ("batch", "single")  # neither always goes first
        with ServerProcess("resources/math", f"workers={args.workers}", *args.server_option) as server:
            for phase in order:
                row[phase] = run_phase(server, phase, bodies, batches, args)
        print(f"round {number}: limit {limit:7.1f}/s (in-process {n / seconds:6.1f}/s x {args.workers}, "
              f"{cpu_in_process / n * 1000:.2f} ms cpu/item); {args.workers} parallel in-process copies: "
              f"{realised:7.1f}/s")
        for phase in ("single", "batch"):
            r = row[phase]
            mismatches = sum(1 for a, b in zip(r["rewards"], expected_rewards) if a != b)
            efficiency = cpu_in_process / (r["cpu"]["server"] + r["cpu"]["workers"])
            r["ratio"] = r["rate"] / limit
            r["ratio_realised"] = r["rate"] / realised
            print(f"  {'/verify      ' if phase == 'single' else '/verify/batch'}: {r['rate']:7.1f} req/s  "
                  f"p50 {r['p50'] * 1000:7.1f} ms  p99 {r['p99'] * 1000:7.1f} ms  ratio {r['ratio']:.2f} "
                  f"(vs parallel copies {r['ratio_realised']:.2f})  "
                  f"cpu/item server {r['cpu']['server'] / n * 1000:.2f} ms + workers "
                  f"{r['cpu']['workers'] / n * 1000:.2f} ms (cpu efficiency {efficiency:.2f})  "
                  f"reward mismatches {mismatches}")
        rounds.append(row)
    best = max(rounds, key=lambda r: r["single"]["ratio"] + r["batch"]["ratio"])
    median = sorted(rounds, key=lambda r: r["single"]["ratio"] + r["batch"]["ratio"])[len(rounds) // 2]
    for name, row in (("best round", best), ("median round", median)):
        print(f"{name}: single {row['single']['rate']:.1f} req/s = {row['single']['ratio']:.2f} of the limit "
              f"(aim 0.8), batch {row['batch']['rate']:.1f} req/s = {row['batch']['ratio']:.2f} of the limit "
              f"(aim 0.8), limit {row['limit']:.1f}/s; vs {args.workers} parallel in-process copies "
              f"({row['realised']:.1f}/s): single {row['single']['ratio_realised']:.2f}, "
              f"batch {row['batch']['ratio_realised']:.2f}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
