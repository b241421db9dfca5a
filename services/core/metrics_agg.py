"""`/aggregate_metrics`: reward statistics, pass@k over repeats, failure counts."""
from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from typing import Any, Iterable

from .errors import BadRequest
from .metrics_nemo import nemo_gym_metrics

_LIST_KEYS = ("verify_responses", "responses", "rollouts", "results", "items")


def metrics_rows(body: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The verify replies in an `/aggregate_metrics` body (a list, or a dict holding one) and its options."""
    if isinstance(body, list):
        return body, {}
    if isinstance(body, dict):
        for key in _LIST_KEYS:
            if isinstance(body.get(key), list):
                return body[key], body
    raise BadRequest("body: expected a list of verify replies or {\"verify_responses\": [...]}")


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0}
    return {
        "mean": statistics.fmean(values),
        "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
    }


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al.): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def aggregate_metrics(body: Any, *, pass_threshold: float | None = None) -> dict[str, Any]:
    rows, options = metrics_rows(body)
    threshold = float(options.get("pass_threshold", pass_threshold if pass_threshold is not None else 1.0))
    failures: Counter[str] = Counter()
    rewards: list[float] = []
    components: dict[str, list[float]] = defaultdict(list)
    groups: dict[Any, list[float]] = defaultdict(list)
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise BadRequest(f"item {i}: expected an object")
        if row.get("failure_kind"):
            failures[str(row["failure_kind"])] += 1
        if row.get("mask_sample"):
            continue
        try:
            reward = float(row.get("reward", 0.0))
        except (TypeError, ValueError):
            raise BadRequest(f"item {i}: reward must be a number") from None
        rewards.append(reward)
        for name, value in (row.get("reward_components") or {}).items():
            components[name].append(float(value))
        groups[row.get("_ng_task_index", f"row{i}")].append(reward)
    out: dict[str, Any] = {
        "num_samples": len(rows),
        "num_scored": len(rewards),
        "num_masked": len(rows) - len(rewards),
        "reward": _stats(rewards),
        "reward_components": {name: _stats(vals) for name, vals in sorted(components.items())},
        "failures": dict(sorted(failures.items())),
    }
    out.update({f"{k}_reward": v for k, v in out["reward"].items()})
    out.update(_pass_at(groups.values(), threshold))
    out.update(nemo_gym_metrics(rows, rewards))
    return out


def _pass_at(groups: Iterable[list[float]], threshold: float) -> dict[str, float]:
    groups = [g for g in groups if g]
    if not groups:
        return {}
    max_n = min(len(g) for g in groups)
    ks = sorted({1, max_n} | {k for k in (2, 4, 8, 16, 32, 64) if k <= max_n})
    result = {}
    for k in ks:
        scores = [pass_at_k(len(g), sum(r >= threshold for r in g), k) for g in groups]
        result[f"pass@{k}"] = statistics.fmean(scores)
    return result
