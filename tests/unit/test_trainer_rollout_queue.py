"""Asynchronous rollouts' queue, staleness and read-ahead logic (trainer/rollout_queue.py)."""
from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from types import SimpleNamespace

import pytest

from trainer.client import background_loop
from trainer.rollout_queue import Lookahead, RolloutQueue, is_stale
from trainer.weight_sync import PolicyHooks, WeightSync


def test_is_stale_counts_versions_in_trainer_steps() -> None:
    assert not is_stale({"policy_version": 5}, step=6, max_policy_lag=1)
    assert is_stale({"policy_version": 4}, step=6, max_policy_lag=1)
    assert not is_stale({"policy_version": 7}, step=6, max_policy_lag=1, offset=2)  # server 7 = step 5
    assert is_stale({"policy_version": 6}, step=6, max_policy_lag=1, offset=2)  # server 6 = step 4
    assert not is_stale({"reward": None, "mask_sample": True}, step=99, max_policy_lag=1)  # no version: a failure
    assert not is_stale({"policy_version": True}, step=99, max_policy_lag=1)


def _queue(max_pending: int) -> tuple[RolloutQueue, dict[str, threading.Event], list[str]]:
    """A queue whose batches finish when their event is set (names the rows' `q`)."""
    gates: dict[str, threading.Event] = defaultdict(threading.Event)
    started: list[str] = []

    async def run_batch(rows: list[dict]) -> list[dict]:
        name = rows[0]["q"]
        started.append(name)
        while not gates[name].is_set():
            await asyncio.sleep(0.01)
        return [{"q": row["q"], "policy_version": 3} for row in rows]

    return RolloutQueue(run_batch, background_loop().loop, max_pending=max_pending), gates, started


@pytest.mark.timeout(30)
def test_queue_is_bounded_and_hands_back_batches_by_key() -> None:
    queue, gates, started = _queue(max_pending=2)
    assert queue.submit("a", [{"q": "a"}]) and queue.submit("b", [{"q": "b"}, {"q": "b"}])
    assert not queue.submit("a", [{"q": "a"}])  # already queued
    assert not queue.submit("c", [{"q": "c"}]) and queue.stats["full"] == 1  # bounded: 2 batches
    assert queue.take("zzz") is None and queue.stats["misses"] == 1 and len(queue) == 2  # a miss keeps the rest
    gates["a"].set()
    gates["b"].set()
    assert queue.take("a") == [{"q": "a", "policy_version": 3}]
    assert [r["q"] for r in queue.take("b", timeout=10) or []] == ["b", "b"]
    assert queue.stats["hits"] == 2 and len(queue) == 0 and sorted(started) == ["a", "b"]


@pytest.mark.timeout(30)
def test_taking_a_later_batch_cancels_the_skipped_ones() -> None:
    queue, gates, _ = _queue(max_pending=3)
    for name in "abc":
        queue.submit(name, [{"q": name}])
    gates["c"].set()
    assert queue.take("c", timeout=10) == [{"q": "c", "policy_version": 3}]
    assert queue.stats["skipped"] == 2 and len(queue) == 0
    queue.submit("d", [{"q": "d"}])
    queue.close()
    assert len(queue) == 0
    with pytest.raises(ValueError):
        RolloutQueue(lambda rows: asyncio.sleep(0), background_loop().loop, max_pending=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("depth", [1, 2])
def test_lookahead_announces_batches_depth_ahead(depth: int) -> None:
    events: list[str] = []
    loader = Lookahead(range(5), lambda batch: events.append(f"ahead {batch}"), depth)
    for batch in loader:
        events.append(f"train {batch}")
    assert len(loader) == 5
    for k in range(5):  # batch k is announced before batch k - depth is trained on
        assert events.index(f"ahead {k}") < events.index(f"train {max(0, k - depth)}")
    assert [e for e in events if e.startswith("train")] == [f"train {k}" for k in range(5)]


def test_lookahead_survives_a_failing_announcement() -> None:
    def fail(batch: int) -> None:
        raise RuntimeError("head down")

    assert list(Lookahead([1, 2], fail, 1)) == [1, 2]


def test_async_pushes_every_step_and_hooks_judge_staleness() -> None:
    pushed: list[int] = []
    sync = WeightSync("http://127.0.0.1:9", max_policy_lag=2, push_every_step=True)
    sync.push = lambda model, step: (pushed.append(step), setattr(sync, "server_version", step))  # type: ignore
    for step in range(4):
        sync.before_rollout(None, step)
        sync.before_rollout(None, step)  # the prefetch and the batch itself: one push per step
    assert pushed == [0, 1, 2, 3]
    sync.offset = 1
    trainer = SimpleNamespace(model=SimpleNamespace(training=True), state=SimpleNamespace(global_step=5),
                              _metrics={"train": defaultdict(list), "eval": defaultdict(list)})
    hooks = PolicyHooks(sync)
    assert not hooks.is_stale(trainer, {"policy_version": 4})  # step 3: lag 2
    assert hooks.is_stale(trainer, {"policy_version": 3})  # step 2: lag 3 > 2
    assert not PolicyHooks(None).is_stale(trainer, {"policy_version": 0})  # no sync: versions unknown
    hooks.on_stats(trainer, {"stale_dropped": 2.0, "prefetch_hit": 1.0})
    assert trainer._metrics["train"]["policy/stale_dropped"] == [2.0]
    assert trainer._metrics["train"]["policy/prefetch_hit"] == [1.0]
