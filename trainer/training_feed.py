"""Training step records -> the head's `POST /training/metrics`, for the dashboard's training charts.

Training must never wait on, or fail because of, a dashboard: records go into a bounded
queue that a background thread sends in batches with a short timeout. When the head is
down or slow, records are dropped (counted, logged once); `metrics.jsonl` in the run's
output directory stays the complete record.

    from trainer.training_feed import report_step
    report_step({"step": 3, "reward": 0.4, "kl": 0.01}, head_url=..., run="my-run")
"""
from __future__ import annotations

import atexit
import logging
import math
import queue
import threading
from typing import Any, Mapping

import httpx

from services.core.auth import auth_headers

from .metrics import MISMATCH_KEYS
from .step_log import ENV_REWARD_PREFIX

log = logging.getLogger("gymserve.training_feed")

BATCH = 100
# TRL names reward functions' means `rewards/<name>/mean` (older releases: `rewards/<name>`).
_COMPONENT_PREFIX = "rewards/"
_FIELDS = {"reward": "reward", "reward_std": "reward_std", "kl": "kl", "loss": "loss",
           "learning_rate": "learning_rate"}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def step_record(record: Mapping[str, Any], run: str = "default") -> dict[str, Any] | None:
    """The head's training record for one trainer log record (a TRL `logs` dict plus `step`);
    None when it has no step. Unknown keys are left out; non-finite numbers become null."""
    step = record.get("step", record.get("global_step"))
    if isinstance(step, bool) or not isinstance(step, (int, float)) or step < 0:
        return None
    out: dict[str, Any] = {"run": run, "step": int(step)}
    for source, target in _FIELDS.items():
        value = _number(record.get(source))
        if value is not None:
            out[target] = value
    components = {}
    for key, value in record.items():
        if isinstance(key, str) and key.startswith(_COMPONENT_PREFIX):
            name = key[len(_COMPONENT_PREFIX):]
            name = name[: -len("/mean")] if name.endswith("/mean") else name
            if "/" not in name and _number(value) is not None:
                components[name] = _number(value)
    if components:
        out["reward_components"] = components
    envs = {key[len(ENV_REWARD_PREFIX):]: _number(value) for key, value in record.items()
            if isinstance(key, str) and key.startswith(ENV_REWARD_PREFIX) and _number(value) is not None}
    if envs:
        out["env_rewards"] = envs
    mismatch = {key: _number(record[key]) for key in MISMATCH_KEYS if _number(record.get(key)) is not None}
    if mismatch:
        out["mismatch"] = mismatch
    for key in ("masked", "policy_version"):
        if isinstance(record.get(key), int) and not isinstance(record.get(key), bool) and record[key] >= 0:
            out[key] = record[key]
    return out


class TrainingFeed:
    """Sends step records to one head from a daemon thread; `post` never blocks or raises."""

    def __init__(self, head_url: str, *, run: str = "default", timeout_s: float = 2.0,
                 max_pending: int = 1000) -> None:
        self.url = head_url.rstrip("/") + "/training/metrics"
        self.run = run
        self.timeout_s = timeout_s
        self.dropped = 0
        self.sent = 0
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=max_pending)
        self._idle = threading.Condition()
        self._pending = 0
        self._warned = False
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="gymserve-training-feed", daemon=True)
        self._thread.start()

    def post(self, record: Mapping[str, Any]) -> None:
        if self._closed:
            return
        body = step_record(record, self.run)
        if body is None:
            return
        with self._idle:
            try:
                self._queue.put_nowait(body)
                self._pending += 1
            except queue.Full:
                self.dropped += 1

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued record was sent or given up on; False when time ran out."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        self.flush(timeout_s)
        self._closed = True

    def _loop(self) -> None:
        with httpx.Client(timeout=self.timeout_s, trust_env=False) as client:
            while True:
                batch = [self._queue.get()]
                while len(batch) < BATCH:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                self._send(client, batch)
                with self._idle:
                    self._pending -= len(batch)
                    self._idle.notify_all()

    def _send(self, client: httpx.Client, batch: list[dict[str, Any]]) -> None:
        try:
            response = client.post(self.url, json=batch, headers=auth_headers())
            if response.status_code == 200:
                self.sent += len(batch)
                return
            problem = f"answered {response.status_code}: {response.text[:300]}"
        except Exception as exc:  # a dashboard must never break training
            problem = f"{type(exc).__name__}: {exc}"
        self.dropped += len(batch)
        if not self._warned:
            self._warned = True
            log.warning("training metrics not sent to %s (%s); training goes on, metrics.jsonl has them",
                        self.url, problem)


_feeds: dict[tuple[str, str], TrainingFeed] = {}
_feeds_lock = threading.Lock()


def feed_for(head_url: str | None = None, run: str = "default") -> TrainingFeed:
    """The process's feed for (head, run), created on first use."""
    from .client import default_head_url

    key = ((head_url or default_head_url()).rstrip("/"), run)
    with _feeds_lock:
        if key not in _feeds:
            _feeds[key] = TrainingFeed(key[0], run=run)
        return _feeds[key]


def report_step(record: Mapping[str, Any], *, head_url: str | None = None, run: str = "default") -> None:
    """Send one trainer step record to the head's dashboard (non-blocking; never raises)."""
    try:
        feed_for(head_url, run).post(record)
    except Exception:  # never fail training
        log.debug("report_step failed", exc_info=True)


@atexit.register
def _flush_all() -> None:
    """At exit, give the last records a moment to reach the head."""
    for feed in list(_feeds.values()):
        feed.close(timeout_s=2.0)
