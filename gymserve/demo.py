"""`make demo` (`python -m gymserve.demo`): the embedded default stack end to end.

Starts `gymserve up` (head on a free port), waits for `all N servers ready`, collects a few
rollouts for every bundled example dataset whose agent is in the stack, prints a reward
table per environment, and stops the stack with SIGINT. Options: `--rows`, `--max-output-tokens`,
`--repeats`, `--out`, and `-- key=value ...` stack overrides passed to `gymserve up`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
READY = re.compile(r"all (\d+) servers ready")


def example_datasets(root: Path = REPO / "datasets") -> list[Path]:
    return sorted(root.glob("*/example.jsonl"))


class Stack:
    """`gymserve up` as a child process whose output is echoed with a prefix."""

    def __init__(self, overrides: list[str], ready_timeout_s: float) -> None:
        from services.core.ports import free_port

        self.port = free_port()
        self.head_url = f"http://127.0.0.1:{self.port}"
        self.ready_timeout_s = ready_timeout_s
        cmd = [sys.executable, "-m", "gymserve", "up", f"head.port={self.port}", *overrides]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     cwd=REPO, start_new_session=True)
        self.ready = threading.Event()
        self.lines: list[str] = []
        self.quiet = False
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if not self.quiet:
                print(f"  [up] {line}", flush=True)
            if READY.search(line):
                self.ready.set()

    def wait_ready(self) -> bool:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.ready.wait(1.0):
                return True
            if self.proc.poll() is not None:
                return False
        return False

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                return self.proc.wait(10)
        return self.proc.returncode


def _limit_rows(rows: list[dict[str, Any]], count: int, max_output_tokens: int) -> list[dict[str, Any]]:
    out = []
    for row in rows[:count]:
        row = json.loads(json.dumps(row))
        params = row.setdefault("responses_create_params", {})
        params["max_output_tokens"] = min(int(params.get("max_output_tokens") or max_output_tokens), max_output_tokens)
        out.append(row)
    return out


async def run_demo(head_url: str, *, rows_per_env: int, max_output_tokens: int, repeats: int,
                   out_dir: Path, datasets: list[Path], concurrency: int = 4) -> list[dict[str, Any]]:
    from services.core.auth import adopt_default_key, auth_headers
    from trainer.client import RolloutClient, agent_name
    from trainer.collect import collect
    from trainer.jsonl import read_rows

    adopt_default_key()  # the key the stack's `gymserve up` generated
    async with httpx.AsyncClient(trust_env=False, headers=auth_headers()) as http:
        names = {r["name"] for r in (await http.get(f"{head_url}/server_instances", timeout=30)).json()}
    # a few rollouts in flight across all environments: the CPU model batches them, while many long
    # prompts at once (workplace, reasoning_gym) would make every call wait for the slowest prefill
    client = RolloutClient(head_url, concurrency=concurrency, deadline_s=900, retries=1)
    planned: list[tuple[str, list[dict[str, Any]]]] = []
    results: dict[str, dict[str, Any]] = {}
    for path in datasets:
        env = path.parent.name
        rows = _limit_rows(read_rows(path), rows_per_env, max_output_tokens)
        agents = sorted({agent_name(r) or "?" for r in rows})
        missing = [a for a in agents if a not in names]
        if missing:
            print(f"skipping {env}: agent(s) {', '.join(missing)} not in the stack", flush=True)
            results[env] = {"env": env, "skipped": f"agent {', '.join(missing)} not in the stack"}
        else:
            planned.append((env, rows))

    async def one(env: str, rows: list[dict[str, Any]]) -> None:
        stats = await collect(rows, out_dir / f"{env}.jsonl", client=client, repeats=repeats)
        overall = json.loads((out_dir / f"{env}_metrics.json").read_text())["overall"]
        failures = [json.loads(line) for line in (out_dir / f"{env}_failures.jsonl").read_text().splitlines()]
        results[env] = {"env": env, "rollouts": stats.done, "scored": overall.get("num_scored", 0),
                        "masked": overall.get("num_masked", 0), "mean_reward": overall.get("mean_reward"),
                        "failures": overall.get("failures", {}), "rollouts_per_s": stats.rate(),
                        "first_failure": failures[0].get("failure_reason") if failures else None}
        print(f"  {env}: {stats.done} rollouts done", flush=True)

    print(f"collecting {sum(len(r) for _, r in planned) * repeats} rollouts for {len(planned)} environments ...",
          flush=True)
    async with client:
        await asyncio.gather(*(one(env, rows) for env, rows in planned))
    return [results[path.parent.name] for path in datasets if path.parent.name in results]


def print_table(results: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="gymserve demo: rewards per environment")
    for column in ("environment", "rollouts", "mean reward", "scored", "masked", "failures", "rollouts/s"):
        table.add_column(column, justify="left" if column in ("environment", "failures") else "right")
    for r in results:
        if "skipped" in r:
            table.add_row(r["env"], "-", "-", "-", "-", f"skipped: {r['skipped']}", "-")
            continue
        mean = "-" if not r["scored"] else f"{r['mean_reward']:.3f}"
        fails = ", ".join(f"{k}: {v}" for k, v in r["failures"].items()) or "none"
        table.add_row(r["env"], str(r["rollouts"]), mean, str(r["scored"]), str(r["masked"]), fails,
                      f"{r['rollouts_per_s']:.2f}")
    console = Console()
    if not console.is_terminal:
        console = Console(width=120)  # piped output (make demo | tee): do not squeeze the table
    console.print(table)
    for r in results:
        if r.get("first_failure"):
            print(f"  {r['env']}: first failure: {r['first_failure'][:300]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gymserve.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2, help="example rows per environment (default 2)")
    parser.add_argument("--repeats", type=int, default=1, help="rollouts per row (default 1)")
    parser.add_argument("--max-output-tokens", type=int, default=48, help="generation cap per model call")
    parser.add_argument("--concurrency", type=int, default=4, help="rollouts in flight across environments")
    parser.add_argument("--out", default=None, help="where rollouts go (default runs/demo)")
    parser.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for the stack")
    parser.add_argument("--head", default=None, help="use a running stack at this head URL instead of starting one")
    parser.add_argument("overrides", nargs="*", help="key=value overrides passed to gymserve up")
    args = parser.parse_args(argv)
    out_dir = Path(args.out or REPO / "runs" / "demo")
    datasets = example_datasets()
    if not datasets:
        print("no datasets/*/example.jsonl found", file=sys.stderr)
        return 2
    stack = None
    started = time.monotonic()
    if args.head:
        head_url = args.head.rstrip("/")
    else:
        print("starting the embedded default stack (gymserve up) ...", flush=True)
        stack = Stack(args.overrides, args.ready_timeout)
        head_url = stack.head_url
    try:
        if stack is not None:
            if not stack.wait_ready():
                print("the stack did not become ready:\n" + "\n".join(stack.lines[-30:]), file=sys.stderr)
                return 1
            stack.quiet = True  # the table is the interesting part now
            print(f"stack ready after {time.monotonic() - started:.0f}s at {head_url}", flush=True)
        try:
            results = asyncio.run(run_demo(head_url, rows_per_env=args.rows, max_output_tokens=args.max_output_tokens,
                                           repeats=args.repeats, out_dir=out_dir, datasets=datasets,
                                           concurrency=args.concurrency))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        print_table(results)
        print(f"rollouts in {out_dir}/ ({time.monotonic() - started:.0f}s in all)")
        ran = [r for r in results if "skipped" not in r]
        return 0 if ran else 1
    finally:
        if stack is not None:
            print("stopping the stack (SIGINT) ...", flush=True)
            code = stack.stop()
            print(f"stack stopped (exit {code})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
