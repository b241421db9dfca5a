"""Aggregated health: each server's readiness plus its traffic and rewards from `/metrics`.

The head samples every server periodically (and on demand) with short timeouts, so a
dead or hung server costs one probe timeout in the background, never a stalled page.
requests/s and latency percentiles cover the last minute of samples (`series.WINDOW_S`);
probe traffic (`/`, `/health`, `/ready`) is left out of the counts. What a probe reads of a
reply is capped (`MAX_READY_BYTES`, `MAX_METRICS_BYTES`): any key holder can register a server,
and its pages must not make the head hold more than that.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import httpx

from services.core.auth import auth_headers

from .registry import Instance
from .series import History, Sample, parse_sample

REPORTED_EXTRAS = ("backend", "replicas")  # what a registrar says about a server (the Ray backend)
MAX_READY_BYTES = 64 * 1024
MAX_METRICS_BYTES = 8 * 1024 * 1024  # a server's Prometheus page; ours are tens of kB


class PageTooLarge(ValueError):
    """A probed page ran over its cap (the rest was not read)."""


async def _capped_get(client: httpx.AsyncClient, url: str, cap: int,
                      headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """(status, body) of a GET, reading at most `cap` bytes of the body (asked for uncompressed, so the
    bytes read are the bytes held)."""
    async with client.stream("GET", url, headers={**(headers or {}), "Accept-Encoding": "identity"}) as reply:
        body = bytearray()
        async for chunk in reply.aiter_raw():
            body += chunk
            if len(body) > cap:
                raise PageTooLarge(f"{url}: more than {cap} bytes")
        return reply.status_code, bytes(body)


class HealthMonitor:
    def __init__(self, instances: Callable[[], list[Instance]], *, interval_s: float = 5.0,
                 probe_timeout_s: float = 3.0) -> None:
        self.instances = instances
        self.interval_s = interval_s
        self.probe_timeout_s = probe_timeout_s
        self.histories: dict[str, History] = {}
        self._last: dict[str, dict[str, Any]] = {}
        self.sampled_at: float | None = None  # wall time of the last probe round
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
            try:
                await self.probe_all()
            except Exception:  # the loop must keep sampling
                pass
            await asyncio.sleep(self.interval_s)

    def last_rows(self) -> list[dict[str, Any]] | None:
        """The rows of the last probe round for servers still registered (None before the first)."""
        if self.sampled_at is None:
            return None
        return [self._last[i.name] for i in self.instances() if i.name in self._last]

    async def probe_all(self) -> list[dict[str, Any]]:
        async with self._lock:
            insts = self.instances()
            now_wall = time.time()  # one time for the round, so servers' samples line up on charts
            rows = await asyncio.gather(*(self._probe(inst, now_wall) for inst in insts))
            names = {inst.name for inst in insts}
            for gone in [n for n in self.histories if n not in names]:
                self.histories.pop(gone, None)
            for gone in [n for n in self._last if n not in names]:
                self._last.pop(gone, None)
            self.sampled_at = now_wall
            return list(rows)

    async def _probe(self, inst: Instance, now_wall: float) -> dict[str, Any]:
        assert self._client is not None
        row: dict[str, Any] = {"name": inst.name, "server_type": inst.server_type, "kind": inst.kind,
                               "url": inst.url, "pid": inst.pid, "registration": inst.status(time.monotonic())}
        for key in REPORTED_EXTRAS:  # what a registrar says about the server (the Ray backend: its replicas)
            if key in inst.extra:
                row[key] = inst.extra[key]
        started = time.perf_counter()
        try:
            status, _ = await _capped_get(self._client, f"{inst.url}/ready", MAX_READY_BYTES)
            row["latency_ms"] = round((time.perf_counter() - started) * 1000, 1)
            row["health"] = "ready" if status == 200 else "starting"
        except (httpx.HTTPError, PageTooLarge) as exc:
            row.update(health="down", error=f"{type(exc).__name__}: {exc}"[:300], latency_ms=None)
        if row["health"] != "down":
            try:
                status, page = await _capped_get(self._client, f"{inst.url}/metrics", MAX_METRICS_BYTES,
                                                 headers=auth_headers() if inst.trusted else {})
                if status == 200:
                    sample = parse_sample(page.decode("utf-8", "replace"), now_wall)
                    sample.in_flight = max(0.0, sample.in_flight - 1)  # not our own probe
                    history = self.histories.setdefault(inst.name, History(min_gap_s=self.interval_s / 2))
                    history.add(sample)
                    row.update(traffic_fields(sample, history))
            except (httpx.HTTPError, ValueError):
                pass
        row["healthy"] = row["health"] == "ready"
        row.setdefault("requests_per_s", None)
        self._last[inst.name] = row
        return row


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def traffic_fields(sample: Sample, history: History) -> dict[str, Any]:
    """A health row's numbers: totals since the server started, rates and percentiles of the last minute."""
    recent = history.recent()
    return {
        "requests_total": sample.requests_total, "errors_total": sample.errors_total,
        "in_flight": sample.in_flight, "failures_total": sample.failures_total,
        "failures_by_kind": {k: v for k, v in sorted(sample.failures.items()) if v},
        "latency_sum_s": sample.latency_sum_s, "latency_count": sample.latency_count,
        "mean_latency_ms": _round(1000 * sample.latency_sum_s / sample.latency_count, 2)
        if sample.latency_count else None,
        "requests_per_s": _round(recent.requests_per_s, 3) if recent else None,
        **{f"latency_p{q}_ms": _round(recent.latency_ms(q / 100), 2) if recent else None for q in (50, 90, 99)},
        "rewards_total": sample.reward_count,
        "judge": dict(sample.judge) if sample.judge else None,
        "reward_mean": _round(sample.reward_sum / sample.reward_count, 6) if sample.reward_count else None,
    }
