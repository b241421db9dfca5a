"""The head's CPU per proxied request: this checkout against an earlier revision, side by side.

Run: `.venv/bin/python benchmarks/head_cpu.py [--base REV] [--rounds 8] [--requests 6000] [--concurrency 64]
[--key-file]`

One cheap upstream (`resources/exact_match`, so the head's own work is a large share of the
machine's) and two heads whose stacks point at it: one running this checkout, one running `REV`
from a temporary git worktree. Rounds of `/servers/exact_match/verify` alternate between the
heads (which goes first alternating too), and each round reads the head's CPU seconds from /proc,
so both see the same drift of a shared machine's speed. Prints each side's CPU per request per
round, the medians and their ratio (ours / base: below 1 is cheaper). `--key-file` runs every
server with a bearer key in a GYMSERVE_API_KEY_FILE, as `gymserve up` does.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gymserve.testing import ServerProcess, verify_body  # noqa: E402
from verify_math import cpu_seconds, drive  # noqa: E402
from versus_revision import revision_tree, short_commit  # noqa: E402

PATH = "/servers/exact_match/verify"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="HEAD", help="git revision to compare against (default: HEAD)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=6000, help="per round and side")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--key-file", action="store_true", help="servers need a key, from a key file")
    args = parser.parse_args()
    bodies = [json.dumps(verify_body(f"The answer is {i % 97}.", expected_answer=str(i % 89))).encode()
              for i in range(args.requests)]
    commit = short_commit(args.base)
    print(f"this checkout vs {args.base} ({commit}); {args.rounds} rounds of {args.requests} requests per side, "
          f"concurrency {args.concurrency}, cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    key = secrets.token_urlsafe(24) if args.key_file else None
    with tempfile.TemporaryDirectory(prefix="head-cpu-") as tmp, revision_tree(commit) as base:
        keyed: dict[str, str] = {}
        if key:
            (Path(tmp) / "api_key").write_text(key + "\n")
            keyed = {"GYMSERVE_API_KEY": "", "GYMSERVE_API_KEY_FILE": str(Path(tmp) / "api_key")}
        used = compare(args, bodies, base, keyed, key)
    median = {name: sorted(values)[len(values) // 2] for name, values in used.items()}
    for name, values in used.items():
        print(f"{name}: head CPU per request, median {median[name]:.0f} µs; rounds "
              + ", ".join(f"{v:.0f}" for v in values))
    print(f"ours / base: {median['ours'] / median['base']:.2f}; load average at the end {os.getloadavg()[0]:.1f}")
    return 0


def compare(args: argparse.Namespace, bodies: list[bytes], base: Path, keyed: dict[str, str],
            key: str | None) -> dict[str, list[float]]:
    """The head's CPU µs per request, per round, of each side."""
    with ServerProcess("resources/exact_match", name="exact_match", env=keyed) as upstream:
        env = {**keyed, "GYMSERVE_SERVER_SPEC": json.dumps(
            {"stack": {"servers": {"exact_match": {"kind": "resources/exact_match", "port": upstream.port}}}})}
        with ServerProcess("head", name="ours", env=env, cwd=ROOT) as ours, \
                ServerProcess("head", name="base", env=env, cwd=base) as theirs:
            heads = {"ours": ours, "base": theirs}
            for head in heads.values():  # warm-up: connections, caches
                asyncio.run(drive(head.port, PATH, bodies[:500], 16, key))
            used: dict[str, list[float]] = {"ours": [], "base": []}
            for k in range(args.rounds):
                for name in (["ours", "base"] if k % 2 == 0 else ["base", "ours"]):
                    pid = heads[name].proc.pid  # type: ignore[union-attr]
                    before = sum(cpu_seconds(pid).values())
                    asyncio.run(drive(heads[name].port, PATH, bodies, args.concurrency, key))
                    used[name].append((sum(cpu_seconds(pid).values()) - before) / len(bodies) * 1e6)
    return used


if __name__ == "__main__":
    raise SystemExit(main())
