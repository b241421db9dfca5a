"""Asynchronous rollouts: batches for the next step(s) are collected while the current one trains.

With `weight_sync.max_policy_lag: k >= 1` the trainer reads its dataloader up to `k` batches
ahead (`Lookahead`) and hands each upcoming batch to a `RolloutQueue`, which starts its
rollouts on the client's background loop at once. When TRL asks the rollout function for
that batch, the finished (or still running) rollouts are taken from the queue instead of
being started then. The queue is bounded: at most `k` batches wait or run at a time; a batch
that finds it full is collected when TRL asks for it, as without overlap.

Every record carries the `policy_version` the policy server sampled it with. A sample more
than `k` versions behind the step that trains on it is dropped and rolled out again on the
current weights; `policy/stale_dropped` in `metrics.jsonl` counts them. A batch TRL asks for
that was not prefetched (evaluation, a reshuffled epoch) is a miss and runs synchronously.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections import OrderedDict, deque
from typing import Any, Awaitable, Callable, Iterator

log = logging.getLogger("gymserve.trainer.async")

Rows = list[dict[str, Any]]
Records = list[dict[str, Any]]


def is_stale(record: dict[str, Any], step: int, max_policy_lag: int, offset: int = 0) -> bool:
    """Whether `record` was sampled more than `max_policy_lag` versions before `step`.

    `offset` converts the server's `weights_version` to trainer steps (see WeightSync).
    A record without an integer `policy_version` (a masked failure) is never stale.
    """
    version = record.get("policy_version")
    if not isinstance(version, int) or isinstance(version, bool):
        return False
    return step - (version - offset) > max_policy_lag


class RolloutQueue:
    """Bounded queue of prefetched rollout batches, keyed by the batch's prompts."""

    def __init__(self, run_batch: Callable[[Rows], Awaitable[Records]], loop: asyncio.AbstractEventLoop, *,
                 max_pending: int) -> None:
        if max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        self._run_batch = run_batch
        self._loop = loop
        self.max_pending = max_pending
        self._pending: OrderedDict[str, concurrent.futures.Future[Records]] = OrderedDict()
        self.stats = {"prefetched": 0, "hits": 0, "misses": 0, "full": 0, "skipped": 0}

    def __len__(self) -> int:
        return len(self._pending)

    def submit(self, key: str, rows: Rows) -> bool:
        """Start the rollouts of an upcoming batch; False when it is queued already or the queue is full."""
        if key in self._pending:
            return False
        if len(self._pending) >= self.max_pending:
            self.stats["full"] += 1
            return False
        self._pending[key] = asyncio.run_coroutine_threadsafe(self._run_batch(rows), self._loop)  # type: ignore[arg-type]
        self.stats["prefetched"] += 1
        return True

    def take(self, key: str, timeout: float | None = None) -> Records | None:
        """The records of a prefetched batch (waiting for the ones still running), or None (a miss).

        Batches are trained in the order they were read ahead, so batches queued before `key`
        were skipped: they are cancelled and their slots freed.
        """
        if key not in self._pending:
            self.stats["misses"] += 1
            return None
        while True:
            first, future = self._pending.popitem(last=False)
            if first == key:
                break
            future.cancel()
            self.stats["skipped"] += 1
        self.stats["hits"] += 1
        return future.result(timeout)

    def close(self) -> None:
        """Cancel what still runs (the end of training)."""
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()


class Lookahead:
    """A dataloader read `depth` batches ahead: `on_batch` sees each batch before it is trained on.

    Everything else (len, sampler, set_epoch) is the wrapped dataloader's.
    """

    def __init__(self, loader: Any, on_batch: Callable[[Any], None], depth: int) -> None:
        self.loader = loader
        self.on_batch = on_batch
        self.depth = depth

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator[Any]:
        inner = iter(self.loader)
        ahead: deque[Any] = deque()

        def pull() -> bool:
            try:
                batch = next(inner)
            except StopIteration:
                return False
            ahead.append(batch)
            try:
                self.on_batch(batch)
            except Exception:  # prefetching is an optimisation: the batch is collected when asked for
                log.exception("could not prefetch the rollouts of an upcoming batch")
            return True

        pull()
        while ahead:
            while len(ahead) <= self.depth and pull():
                pass
            yield ahead.popleft()
