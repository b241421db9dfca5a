"""NeMo-Gym's `AggregateMetrics` shape of `/aggregate_metrics`, beside gymserve's flat keys.

NeMo-Gym 0.7.0's collector validates the reply with its `AggregateMetrics` model and keeps only
`agent_metrics`, `key_metrics`, `group_level_metrics` and `repeat_level_metrics`; a flat reply
loses every number without an error. The names and statistics are NeMo-Gym's: `mean/reward`,
`max/reward`, `min/reward`, `median/reward`, `std/reward` (sample standard deviation) over the
scored rollouts, per task (`_ng_task_index`) and per repeat (`_ng_rollout_index`), and
`coverage/*` counts when some rollouts were masked (masked rollouts never enter the statistics).
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

TASK = "_ng_task_index"
REPEAT = "_ng_rollout_index"


def _describe(values: list[float], *, single_std: float | None = 0.0) -> dict[str, float]:
    out = {"mean/reward": statistics.fmean(values), "max/reward": max(values), "min/reward": min(values),
           "median/reward": statistics.median(values)}
    std = statistics.stdev(values) if len(values) > 1 else single_std
    if std is not None:
        out["std/reward"] = std
    return out


def _coverage(rows: list[dict[str, Any]], scored: list[dict[str, Any]]) -> dict[str, int]:
    """Only when something was masked, as NeMo-Gym (a run without masking keeps its old keys)."""
    if len(scored) == len(rows):
        return {}
    tasks, measured = {r.get(TASK, 0) for r in rows}, {r.get(TASK, 0) for r in scored}
    return {"coverage/measured_rollouts": len(scored), "coverage/masked_rollouts": len(rows) - len(scored),
            "coverage/measured_tasks": len(measured), "coverage/fully_masked_tasks": len(tasks - measured)}


def nemo_gym_metrics(rows: list[dict[str, Any]], rewards: list[float]) -> dict[str, Any]:
    """`rows`: every verify reply; `rewards`: the rewards of the unmasked ones, in order."""
    scored = [r for r in rows if not r.get("mask_sample")]
    coverage = _coverage(rows, scored)
    if not rewards:
        return {"agent_metrics": dict(coverage), "key_metrics": dict(coverage),
                "group_level_metrics": [], "repeat_level_metrics": []}
    by_task: dict[Any, list[float]] = defaultdict(list)
    by_repeat: dict[Any, list[float]] = defaultdict(list)
    for row, reward in zip(scored, rewards):
        by_task[row.get(TASK, 0)].append(reward)
        by_repeat[row.get(REPEAT, 0)].append(reward)
    groups = [{TASK: task, **_describe(by_task[task]), "num_rollouts": len(by_task[task])}
              for task in sorted(by_task, key=str)]
    repeats = [{REPEAT: rep, "sample_count": len(vals), **_describe(vals, single_std=None)}
               for rep, vals in sorted(by_repeat.items(), key=lambda kv: str(kv[0]))] if len(by_repeat) > 1 else []
    repeats_run = len({r.get(REPEAT, 0) for r in rows})  # masked rollouts count as repeats that ran
    agent = {**_describe(rewards, single_std=None), "num_repeats": repeats_run, **coverage}
    return {"agent_metrics": agent, "key_metrics": {"mean/reward": agent["mean/reward"], **coverage},
            "group_level_metrics": groups, "repeat_level_metrics": repeats}
