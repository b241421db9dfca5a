"""What the head keeps from each server's `/metrics`: cumulative samples over time, and the
rates, latency percentiles and reward statistics derived from them.

Servers expose only counters and histograms (cheap, Prometheus-native, nothing lost
when the head restarts); the head turns the difference between two samples into
"per second" and "in the last minute" numbers, the way Prometheus' `rate` and
`histogram_quantile` do.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Iterable

from prometheus_client.parser import text_string_to_metric_families

PROBE_PATHS = frozenset({"/", "/health", "/ready"})
WINDOW_S = 60.0  # "now" numbers (req/s, percentiles, recent reward mean) cover the last minute
HISTORY_POINTS = 720  # an hour at the default 5 s sampling
# A judged environment's judge counters (services/core/judge.py), summed over its judges.
JUDGE_SERIES = {"gymserve_judge_calls_total": "calls", "gymserve_judge_cache_hits_total": "cache_hits",
                "gymserve_judge_failures_total": "failures"}


@dataclass
class Sample:
    """One server's cumulative counters at wall time `t` (everything but `in_flight` only grows)."""

    t: float
    requests_total: float = 0.0
    errors_total: float = 0.0
    in_flight: float = 0.0
    latency_sum_s: float = 0.0
    latency_count: float = 0.0
    latency_buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    failures: dict[str, float] = field(default_factory=dict)  # failure kind -> count
    reward_sum: float = 0.0
    reward_count: float = 0.0
    reward_buckets: dict[float, float] = field(default_factory=dict)
    judge: dict[str, float] = field(default_factory=dict)  # judge calls, cache hits, failures (all judges)

    @property
    def failures_total(self) -> float:
        return sum(self.failures.values())


def parse_sample(text: str, t: float) -> Sample:
    """A `Sample` from a gymserve `/metrics` page; probe traffic (`/`, `/health`, `/ready`) is left out."""
    s = Sample(t=t)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            probe = labels.get("path") in PROBE_PATHS
            if name == "gymserve_requests_total" and not probe:
                s.requests_total += value
                if labels.get("status", "").startswith("5"):
                    s.errors_total += value
            elif name == "gymserve_requests_in_flight":
                s.in_flight += value
            elif name == "gymserve_failures_total":
                kind = labels.get("kind", "unknown")
                s.failures[kind] = s.failures.get(kind, 0.0) + value
            elif name == "gymserve_request_duration_seconds_sum" and not probe:
                s.latency_sum_s += value
            elif name == "gymserve_request_duration_seconds_count" and not probe:
                s.latency_count += value
            elif name == "gymserve_request_duration_seconds_bucket" and not probe:
                le = float(labels["le"])
                s.latency_buckets[le] = s.latency_buckets.get(le, 0.0) + value
            elif name == "gymserve_reward_value_sum":
                s.reward_sum += value
            elif name == "gymserve_reward_count":
                s.reward_count += value
            elif name == "gymserve_reward_bucket":
                le = float(labels["le"])
                s.reward_buckets[le] = s.reward_buckets.get(le, 0.0) + value
            elif name in JUDGE_SERIES:
                key = JUDGE_SERIES[name]
                s.judge[key] = s.judge.get(key, 0.0) + value
    return s


def _since(new: float, old: float) -> float:
    """Counter growth; a counter that went down means the server restarted and began again at 0."""
    return new - old if new >= old else new


def _bucket_delta(new: dict[float, float], old: dict[float, float], restarted: bool) -> list[tuple[float, float]]:
    return sorted((le, count if restarted else count - old.get(le, 0.0)) for le, count in new.items())


def quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """The q-quantile from cumulative `(le, count)` buckets, linear inside a bucket (Prometheus'
    `histogram_quantile`); None without observations. The +Inf bucket answers its lower edge."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    rank = q * ordered[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return lower_le


@dataclass
class Window:
    """What happened between two samples of one server."""

    seconds: float
    requests: float
    latency_buckets: list[tuple[float, float]]
    reward_sum: float
    reward_count: float

    @property
    def requests_per_s(self) -> float | None:
        return self.requests / self.seconds if self.seconds > 0 else None

    def latency_ms(self, q: float) -> float | None:
        value = quantile(q, self.latency_buckets)
        return None if value is None else 1000 * value

    @property
    def reward_mean(self) -> float | None:
        return self.reward_sum / self.reward_count if self.reward_count else None


def window(old: Sample, new: Sample) -> Window:
    restarted = new.requests_total < old.requests_total or new.reward_count < old.reward_count
    base = Sample(t=old.t) if restarted else old
    return Window(seconds=new.t - old.t, requests=_since(new.requests_total, base.requests_total),
                  latency_buckets=_bucket_delta(new.latency_buckets, base.latency_buckets, restarted),
                  reward_sum=new.reward_sum - base.reward_sum,
                  reward_count=_since(new.reward_count, base.reward_count))


class History:
    """One server's recent samples, oldest first, at most one per `min_gap_s` (a newer sample
    inside the gap replaces the last one, so on-demand probes cannot flood it)."""

    def __init__(self, min_gap_s: float = 1.0, maxlen: int = HISTORY_POINTS) -> None:
        self.min_gap_s = min_gap_s
        self.samples: collections.deque[Sample] = collections.deque(maxlen=maxlen)
        self._anchor_t: float | None = None  # time of the sample that opened the current gap

    def add(self, sample: Sample) -> None:
        last = self.samples[-1] if self.samples else None
        if last is not None and (sample.requests_total < last.requests_total
                                 or sample.reward_count < last.reward_count):
            self.samples.clear()  # the server restarted: its counters began again
            last = None
        if last is not None and len(self.samples) > 1 and self._anchor_t is not None \
                and sample.t - self._anchor_t < self.min_gap_s:
            self.samples[-1] = sample
            return
        self.samples.append(sample)
        self._anchor_t = sample.t

    @property
    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def recent(self, window_s: float = WINDOW_S) -> Window | None:
        """The last `window_s` seconds (or as much of it as is known); None before two samples."""
        if len(self.samples) < 2:
            return None
        new = self.samples[-1]
        old = next((s for s in self.samples if new.t - s.t <= window_s), self.samples[-2])
        if old is new:
            old = self.samples[-2]
        return window(old, new)

    def series(self, window_s: float = WINDOW_S) -> list[tuple[float, Window]]:
        """For each sample after the first: the window of up to `window_s` seconds ending there."""
        out: list[tuple[float, Window]] = []
        samples = list(self.samples)
        start = 0
        for i in range(1, len(samples)):
            while start < i - 1 and samples[i].t - samples[start].t > window_s:
                start += 1
            out.append((samples[i].t, window(samples[start], samples[i])))
        return out
