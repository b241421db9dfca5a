"""Rollout collection: rows -> agents -> rollouts, failures and aggregate metrics on disk.

Files (for OUT = `rollouts.jsonl`): `rollouts.jsonl` (one finished rollout per line,
appended and flushed as each finishes), `rollouts_failures.jsonl` (failed rollouts of
the latest run, masked, with reasons), `rollouts_metrics.json` (per agent: mean
reward, pass@k, failure counts) and `rollouts_report.html` (reward histogram and
failures by kind per agent, readable without a server). `resume=True` skips (task, rollout) pairs already in
OUT and retries the rest, including earlier failures. `batch_deadline_s` bounds the whole
run: rollouts still running (or not started) when it passes are cancelled and recorded as
`timeout` failures, counted in the metrics' `run.cut_by_batch_deadline`. Rollouts run and are
written by GRPO group (a row's repeats), so an environment that scores groups sees the whole group;
on resume such a group with a rollout still to run is run again whole.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from services.core.metrics_agg import aggregate_metrics

from .client import RolloutClient, agent_name, cut_by_batch_deadline, expand_repeats, group_rows, is_failure
from .jsonl import JsonlAppender, read_complete_lines, read_rows
from .report import write_report

log = logging.getLogger("gymserve.collect")


def sibling(out: str | Path, suffix: str) -> Path:
    """`out.jsonl` + `_failures.jsonl` -> `out_failures.jsonl`."""
    p = Path(out)
    stem = p.name[: -len(p.suffix)] if p.suffix else p.name
    return p.with_name(stem + suffix)


def _key(record: dict[str, Any]) -> tuple[Any, Any]:
    return record.get("_ng_task_index"), record.get("_ng_rollout_index")


@dataclass
class AgentStats:
    done: int = 0
    failed: int = 0
    reward_sum: float = 0.0

    @property
    def mean_reward(self) -> float | None:
        scored = self.done - self.failed
        return self.reward_sum / scored if scored else None


@dataclass
class CollectStats:
    total: int = 0
    skipped: int = 0
    cut_by_deadline: int = 0
    batch_deadline_s: float | None = None
    started_at: float = field(default_factory=time.monotonic)
    agents: dict[str, AgentStats] = field(default_factory=lambda: defaultdict(AgentStats))

    @property
    def done(self) -> int:
        return sum(a.done for a in self.agents.values())

    @property
    def failed(self) -> int:
        return sum(a.failed for a in self.agents.values())

    def rate(self) -> float:
        elapsed = time.monotonic() - self.started_at
        return self.done / elapsed if elapsed > 0 else 0.0

    def add(self, record: dict[str, Any]) -> None:
        stats = self.agents[agent_name(record) or "<no agent_ref>"]
        stats.done += 1
        if is_failure(record):
            stats.failed += 1
            self.cut_by_deadline += cut_by_batch_deadline(record)
        else:
            stats.reward_sum += float(record["reward"])


def metrics_by_agent(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregate metrics (core `aggregate_metrics`) per agent and overall."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        groups[agent_name(record) or "<no agent_ref>"].append(record)
    return {"overall": aggregate_metrics(records) if records else {"num_samples": 0},
            "agents": {name: aggregate_metrics(rows) for name, rows in sorted(groups.items())}}


async def collect(rows: list[dict[str, Any]], out: str | Path, *, client: RolloutClient, repeats: int = 1,
                  resume: bool = False, batch_deadline_s: float | None = None,
                  on_record: Callable[[dict[str, Any], CollectStats], None] | None = None) -> CollectStats:
    """Run every (row, repeat) and write the three files; returns the run's statistics.

    On cancellation (Ctrl-C) the in-flight rollouts are dropped, the files keep only whole
    lines, and the metrics file is still written for what finished.
    """
    out = Path(out)
    failures_path, metrics_path = sibling(out, "_failures.jsonl"), sibling(out, "_metrics.json")
    report_path = sibling(out, "_report.html")
    work = expand_repeats(rows, repeats)
    finished: list[dict[str, Any]] = []
    if resume:
        finished = await whole_groups([r for r in read_complete_lines(out) if not is_failure(r)], work, client, out)
        done_keys = {_key(r) for r in finished}
        work = [item for item in work if _key(item) not in done_keys]
    stats = CollectStats(total=len(work), skipped=len(expand_repeats(rows, repeats)) - len(work),
                         batch_deadline_s=batch_deadline_s)
    deadline_at = None if batch_deadline_s is None else stats.started_at + batch_deadline_s
    failures: list[dict[str, Any]] = []
    # one queue entry per GRPO group (a task's repeats): an environment that scores groups needs them all
    queue: asyncio.Queue[list[dict[str, Any]]] = asyncio.Queue()
    for members in group_rows(work):
        queue.put_nowait([work[i] for i in members])

    with JsonlAppender(out, truncate=not resume) as rollouts_file, \
            JsonlAppender(failures_path, truncate=True) as failures_file:

        async def worker() -> None:
            while True:
                try:
                    group = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                for record in await client.run_group(group, deadline_at):
                    if is_failure(record):
                        failures_file.write(record)
                        failures.append(record)
                    else:
                        rollouts_file.write(record)
                        finished.append(record)
                    stats.add(record)
                    if on_record is not None:
                        on_record(record, stats)

        workers = [asyncio.create_task(worker()) for _ in range(min(client.concurrency, max(1, queue.qsize())))]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            write_metrics(metrics_path, finished + failures, stats)
            try:
                write_report(finished + failures, report_path, title=f"gymserve collect: {out.name}")
            except Exception:  # the report is a convenience: the rollouts are already safe
                log.exception("could not write %s", report_path)
    return stats


async def whole_groups(finished: list[dict[str, Any]], work: list[dict[str, Any]], client: RolloutClient,
                       out: Path) -> list[dict[str, Any]]:
    """On resume, a group that an environment scores as a whole runs again as a whole: its finished
    rollouts are dropped from OUT when another rollout of it is still to run (it failed or never ran)."""
    done = {_key(r) for r in finished}
    open_groups = {(agent_name(item), item.get("_ng_task_index")) for item in work if _key(item) not in done}
    started = {(agent_name(r), r.get("_ng_task_index")) for r in finished} & open_groups
    redo = {group for group in started if group[0] and await client.groups.group_server(group[0])}
    if not redo:
        return finished
    kept = [r for r in finished if (agent_name(r), r.get("_ng_task_index")) not in redo]
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept))
    tmp.replace(out)
    log.info("resume: %d partly finished group(s) of group-reward environments run again whole", len(redo))
    return kept


def write_metrics(path: Path, records: list[dict[str, Any]], stats: CollectStats) -> dict[str, Any]:
    metrics = metrics_by_agent(records)
    metrics["run"] = {"rollouts": stats.done, "failed": stats.failed, "skipped_resumed": stats.skipped,
                      "planned": stats.total, "rollouts_per_s": round(stats.rate(), 4),
                      "elapsed_s": round(time.monotonic() - stats.started_at, 3),
                      "batch_deadline_s": stats.batch_deadline_s, "cut_by_batch_deadline": stats.cut_by_deadline}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(metrics, indent=2, sort_keys=True))
    tmp.replace(path)
    return metrics


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    return read_rows(path)
