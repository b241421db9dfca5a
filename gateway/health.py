"""Aggregated health: each server's readiness plus its throughput from `/metrics`.

The head samples every server periodically (and on demand); requests/s is the
growth of the server's request counter over the last minute of samples. Probe
traffic (`/`, `/health`, `/ready`) is left out of the count.
"""
from __future__ import annotations

import asyncio
import collections
import time
from typing import Any, Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from services.core.auth import auth_headers

from .registry import Instance

PROBE_PATHS = frozenset({"/", "/health", "/ready"})
WINDOW_S = 60.0
REPORTED_EXTRAS = ("backend", "replicas")


def parse_metrics(text: str) -> dict[str, float]:
    """Totals we show from a gymserve `/metrics` page."""
    out = {"requests_total": 0.0, "errors_total": 0.0, "in_flight": 0.0, "failures_total": 0.0,
           "latency_sum_s": 0.0, "latency_count": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "gymserve_requests_total" and labels.get("path") not in PROBE_PATHS:
                out["requests_total"] += sample.value
                if labels.get("status", "").startswith("5"):
                    out["errors_total"] += sample.value
            elif sample.name == "gymserve_requests_in_flight":
                out["in_flight"] += sample.value
            elif sample.name == "gymserve_failures_total":
                out["failures_total"] += sample.value
            elif sample.name == "gymserve_request_duration_seconds_sum" and labels.get("path") not in PROBE_PATHS:
                out["latency_sum_s"] += sample.value
            elif sample.name == "gymserve_request_duration_seconds_count" and labels.get("path") not in PROBE_PATHS:
                out["latency_count"] += sample.value
    return out


class HealthMonitor:
    def __init__(self, instances: Callable[[], list[Instance]], *, interval_s: float = 5.0,
                 probe_timeout_s: float = 3.0) -> None:
        self.instances = instances
        self.interval_s = interval_s
        self.probe_timeout_s = probe_timeout_s
        self._samples: dict[str, collections.deque[tuple[float, float]]] = collections.defaultdict(
            lambda: collections.deque(maxlen=64))
        self._last: dict[str, dict[str, Any]] = {}
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=self.probe_timeout_s, trust_env=False)
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._client:
            await self._client.aclose()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.probe_all()
            except Exception:  # the loop must keep sampling
                pass

    async def probe_all(self) -> list[dict[str, Any]]:
        async with self._lock:
            insts = self.instances()
            rows = await asyncio.gather(*(self._probe(inst) for inst in insts))
            names = {inst.name for inst in insts}
            for gone in [n for n in self._samples if n not in names]:
                self._samples.pop(gone, None)
                self._last.pop(gone, None)
            return list(rows)

    async def _probe(self, inst: Instance) -> dict[str, Any]:
        assert self._client is not None
        now_wall = time.time()
        row: dict[str, Any] = {"name": inst.name, "server_type": inst.server_type, "kind": inst.kind,
                               "url": inst.url, "pid": inst.pid, "registration": inst.status(time.monotonic())}
        for key in REPORTED_EXTRAS:  # what a registrar says about the server (the Ray backend: its replicas)
            if key in inst.extra:
                row[key] = inst.extra[key]
        started = time.perf_counter()
        try:
            ready = await self._client.get(f"{inst.url}/ready")
            row["latency_ms"] = round((time.perf_counter() - started) * 1000, 1)
            row["health"] = "ready" if ready.status_code == 200 else "starting"
        except httpx.HTTPError as exc:
            row.update(health="down", error=f"{type(exc).__name__}: {exc}"[:300], latency_ms=None)
        if row["health"] != "down":
            try:
                page = await self._client.get(f"{inst.url}/metrics", headers=auth_headers())
                if page.status_code == 200:
                    totals = parse_metrics(page.text)
                    totals["in_flight"] = max(0.0, totals["in_flight"] - 1)  # not our own probe
                    row.update(totals)
                    samples = self._samples[inst.name]
                    if samples and totals["requests_total"] < samples[-1][1]:
                        samples.clear()  # the server restarted: its counters began again
                    samples.append((now_wall, totals["requests_total"]))
                    while len(samples) > 2 and now_wall - samples[0][0] > WINDOW_S:
                        samples.popleft()
                    first_t, first_n = samples[0]
                    dt = now_wall - first_t
                    row["requests_per_s"] = round((totals["requests_total"] - first_n) / dt, 3) if dt > 0 else None
                    if totals["latency_count"]:
                        row["mean_latency_ms"] = round(1000 * totals["latency_sum_s"] / totals["latency_count"], 2)
            except (httpx.HTTPError, ValueError):
                pass
        row["healthy"] = row["health"] == "ready"
        row.setdefault("requests_per_s", None)
        self._last[inst.name] = row
        return row
