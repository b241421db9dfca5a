"""Prometheus metrics shared by every server (one registry per app, so tests can host several)."""
from __future__ import annotations

import bisect
import math
from typing import Any, Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_MAX_CACHED_SERIES = 4096
# Rewards are mostly in [0, 1] (tenths there), with coarser bins outside for reward models and sums.
REWARD_BUCKETS = (-10, -5, -2, -1, -0.5, -0.25, 0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1, 1.5, 2, 5, 10)


class Metrics:
    """Request counts, latency, in-flight requests, failures by kind and judged rewards."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, server: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"server": server}
        self.requests = Counter(
            "gymserve_requests", "HTTP requests served", ["method", "path", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "gymserve_request_duration_seconds", "HTTP request latency", ["method", "path"],
            buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.in_flight = Gauge("gymserve_requests_in_flight", "HTTP requests in progress", registry=self.registry)
        self.failures = Counter(
            "gymserve_failures", "Infrastructure failures by kind", ["kind"], registry=self.registry
        )
        self.rewards = Histogram(
            "gymserve_reward", "Rewards of judged (not masked) verify replies", buckets=REWARD_BUCKETS,
            registry=self.registry,
        )
        # Prometheus histograms with negative buckets expose no _sum (rewards can be negative): keep it here.
        self.reward_sum = Gauge("gymserve_reward_value_sum", "Sum of judged rewards", registry=self.registry)
        self.info = Gauge("gymserve_server_info", "Server identity", list(labels), registry=self.registry)
        self.info.labels(**labels).set(1)

        self._judges: JudgeMetrics | None = None
        self._served: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    @property
    def judges(self) -> "JudgeMetrics":
        """Per-judge series, registered on first use (only servers that call a judge show them)."""
        if self._judges is None:
            self._judges = JudgeMetrics(self.registry)
        return self._judges

    def served(self, method: str, path: str, status: int, elapsed: float) -> None:
        """Count one request and its latency. The series are looked up once per (method, path, status):
        prometheus_client's `labels()` checks and locks on every call, on every request of every server."""
        key = (method, path, status)
        series = self._served.get(key)
        if series is None:
            if len(self._served) >= _MAX_CACHED_SERIES:  # raw paths of unmatched routes: bound the cache
                self._served.clear()
            series = self._served[key] = (self.requests.labels(method=method, path=path, status=str(status)),
                                          self.latency.labels(method=method, path=path))
        series[0].inc()
        series[1].observe(elapsed)

    def failure(self, kind: str | None, count: int = 1) -> None:
        if kind:
            self.failures.labels(kind=kind).inc(count)

    def reward(self, value: float) -> None:
        self.rewards.observe(value)
        self.reward_sum.inc(value)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class JudgeMetrics:
    """Calls to judge models, labelled by judge (its instance name or URL)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter("gymserve_judge_calls", "Judge model calls by outcome (ok or a failure kind)",
                             ["judge", "outcome"], registry=registry)
        self.latency = Histogram("gymserve_judge_latency_seconds", "Judge call latency, retries included", ["judge"],
                                 buckets=_LATENCY_BUCKETS, registry=registry)
        self.cache_hits = Counter("gymserve_judge_cache_hits", "Judge questions answered from the cache", ["judge"],
                                  registry=registry)
        self.verdicts = Counter("gymserve_judge_verdicts", "Judge verdicts by label", ["judge", "verdict"],
                                registry=registry)
        self.failures = Counter("gymserve_judge_failures", "Judge questions without a verdict, by reason",
                                ["judge", "reason"], registry=registry)


Bin = dict[str, "float | int | None"]


def bins_from_buckets(buckets: dict[float, float]) -> list[Bin]:
    """Cumulative Prometheus `le` buckets as plain bins `{lo, hi, count}` for (lo, hi]; the
    open-ended outer bins have `lo` or `hi` None (JSON has no infinity). Empty bins at both
    ends are dropped."""
    bins: list[Bin] = []
    lower, below = None, 0.0
    for le, cumulative in sorted(buckets.items()):
        bins.append({"lo": lower, "hi": None if math.isinf(le) else le, "count": int(round(cumulative - below))})
        lower, below = le, cumulative
    while bins and bins[0]["count"] == 0:
        bins.pop(0)
    while bins and bins[-1]["count"] == 0:
        bins.pop()
    return bins


def reward_bins(rewards: Iterable[float]) -> list[Bin]:
    """Rewards binned exactly as the `gymserve_reward` histogram bins them (for offline reports)."""
    edges = [float(b) for b in REWARD_BUCKETS] + [math.inf]
    counts = [0] * len(edges)
    for value in rewards:
        counts[bisect.bisect_left(edges, value)] += 1
    cumulative, total = {}, 0
    for edge, count in zip(edges, counts):
        total += count
        cumulative[edge] = float(total)
    return bins_from_buckets(cumulative)
