"""`gymserve collect -i ROWS -o OUT [--head URL] [--repeats N] [--concurrency N] [--resume]`."""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections import Counter
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--input", required=True, help="rows (JSONL) with agent_ref or task_source (or use --agent)")
    parser.add_argument("-o", "--output", required=True, help="rollouts JSONL (failures and metrics go next to it)")
    parser.add_argument("--head", default=None, help="head URL (default: $GYMSERVE_HEAD_URL or http://127.0.0.1:11000)")
    parser.add_argument("--repeats", type=int, default=1, help="rollouts per row (for pass@k and GRPO groups)")
    parser.add_argument("--concurrency", type=int, default=32, help="rollouts in flight at once")
    parser.add_argument("--resume", action="store_true", help="skip (task, rollout) pairs already in OUTPUT")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds per rollout, retries included")
    parser.add_argument("--batch-deadline-s", type=float, default=None,
                        help="seconds for the whole run: rollouts still running then are cancelled, masked as timeout")
    parser.add_argument("--retries", type=int, default=2, help="retries of a rollout whose agent is unreachable")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N rows")
    parser.add_argument("--agent", default=None, metavar="NAME",
                        help="send every row to this agent instance, as NeMo-Gym's +agent_name (rows need no agent_ref)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (plain summary only)")


def _stats_text(stats: Any) -> str:
    parts = []
    for name, agent in sorted(stats.agents.items()):
        mean = agent.mean_reward
        parts.append(f"{name}: {'-' if mean is None else f'{mean:.3f}'}" + (f" ({agent.failed} failed)" if agent.failed else ""))
    return f"{stats.rate():.2f} rollouts/s  " + "  ".join(parts)


def print_failure_groups(failures: Counter[tuple[str, str]], shown: int = 5) -> None:
    """Why rollouts failed, most frequent reason first: the answer to "N failed" without opening the file."""
    if not failures:
        return
    print("why rollouts failed (count, kind, reason):")
    for (kind, reason), count in failures.most_common(shown):
        print(f"  {count} x {kind}: {reason[:300]}")
    if len(failures) > shown:
        print(f"  ... {len(failures) - shown} more reasons in the failures file")
def head_config(head: str | None) -> dict[str, Any]:
    """The head's config (`/global_config_dict_yaml`), to resolve rows' `task_source`."""
    import httpx
    import yaml

    from services.core.auth import auth_headers
    from trainer.client import default_head_url

    url = (head or default_head_url()).rstrip("/")
    try:
        response = httpx.get(f"{url}/global_config_dict_yaml", headers=auth_headers(), timeout=30, trust_env=False)
    except httpx.HTTPError as exc:
        raise OSError(f"cannot read the head's config at {url}: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise OSError(f"the head at {url} answered {response.status_code} to /global_config_dict_yaml")
    config = yaml.safe_load(response.json())
    if not isinstance(config, dict):
        raise ValueError(f"the head at {url} served no config mapping")
    return config


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trainer.client import RolloutClient, is_failure, route_to
    from trainer.collect import collect, sibling
    from trainer.jsonl import JsonlError, read_rows
    from trainer.task_source import TaskSourceError, needs_resolution, resolve_task_sources

    console = Console(stderr=True)
    if args.repeats < 1 or args.concurrency < 1:
        console.print("gymserve collect: --repeats and --concurrency must be >= 1")
        return 2
    if args.batch_deadline_s is not None and not args.batch_deadline_s > 0:
        console.print("gymserve collect: --batch-deadline-s must be > 0")
        return 2
    try:
        rows = read_rows(args.input)
    except (OSError, JsonlError) as exc:
        console.print(f"gymserve collect: cannot read {args.input}:\n{exc}", markup=False)
        return 2
    if args.limit is not None:
        rows = rows[: args.limit]
    if args.agent:
        rows, overridden = route_to(rows, args.agent)
        if overridden:
            console.print(f"gymserve collect: --agent {args.agent} overrides the agent_ref of {overridden} rows",
                          markup=False)
    elif needs_resolution(rows):
        try:
            resolve_task_sources(rows, head_config(args.head))
        except (TaskSourceError, OSError, ValueError) as exc:
            console.print(f"gymserve collect: {exc}", markup=False)
            return 2
    client = RolloutClient(args.head, concurrency=args.concurrency, deadline_s=args.deadline, retries=args.retries)
    source = "--head" if args.head else ("$GYMSERVE_HEAD_URL" if os.environ.get("GYMSERVE_HEAD_URL") else "the default")
    print(f"head: {client.directory.head_url} (from {source})", flush=True)
    failures: Counter[tuple[str, str]] = Counter()
    progress = Progress(TextColumn("collect"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.fields[stats]}"), console=console, disable=args.no_progress,
                        transient=False)
    task_id = progress.add_task("collect", total=len(rows) * args.repeats, stats="")

    def on_record(record: dict, stats: Any) -> None:
        if is_failure(record):
            failures[(str(record.get("failure_kind") or "?"), str(record.get("failure_reason") or "no reason given"))] += 1
        progress.update(task_id, completed=stats.done + stats.skipped, stats=_stats_text(stats))

    terminated = False

    async def collect_and_close() -> Any:
        # SIGTERM (kill, `docker stop`, a batch scheduler) stops like Ctrl-C: the run is cancelled,
        # finished rollouts stay as whole lines
        task = asyncio.current_task()
        assert task is not None

        def terminate() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminate)
        async with client:
            return await collect(rows, args.output, client=client, repeats=args.repeats, resume=args.resume,
                                 batch_deadline_s=args.batch_deadline_s, on_record=on_record)

    stats = None
    with progress:
        try:
            stats = asyncio.run(collect_and_close())
        except (KeyboardInterrupt, asyncio.CancelledError):
            pass
    if stats is None:
        console.print(f"interrupted: finished rollouts are in {args.output}; run again with --resume to go on")
        return 128 + signal.SIGTERM if terminated else 130
    cut = f", {stats.cut_by_deadline} cut by the batch deadline" if stats.cut_by_deadline else ""
    print(f"{stats.done} rollouts ({stats.failed} failed{cut}, {stats.skipped} already done) in "
          f"{stats.rate():.2f} rollouts/s -> {args.output}; failures: {sibling(args.output, '_failures.jsonl')}; "
          f"metrics: {sibling(args.output, '_metrics.json')}; report: {sibling(args.output, '_report.html')}",
          file=sys.stdout)
    for name, agent in sorted(stats.agents.items()):
        mean = agent.mean_reward
        print(f"  {name}: mean reward {'-' if mean is None else f'{mean:.4f}'}, "
              f"{agent.done - agent.failed} scored, {agent.failed} failed")
    print_failure_groups(failures)
    return 1 if stats.done and stats.failed == stats.done else 0
