"""Admission control: a bounded, first-come-first-served queue in front of a server's handlers.

At most `max_concurrent` requests run their handler at once; the next ones wait in arrival
order (a slot freed by a finishing request goes to the oldest waiter, never to a newcomer).
When `max_queued` requests already wait, a new one is refused at once with 503 and
`Retry-After` (the core client waits that long, within its deadline, and tries again),
instead of joining a queue so long that it would time out anyway. A request that waited
`max_wait_s` without getting a slot is refused the same way. Liveness, readiness and metrics
are never queued. A plain ASGI middleware: it costs a counter check per request when the
server is not saturated.
"""
from __future__ import annotations

import asyncio
import collections
import math
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import error_body
from .reply import send_json
from .request_id import request_id_of

EXEMPT_PATHS = frozenset({"/", "/health", "/ready", "/metrics"})


class AdmissionQueue:
    """FIFO admission with a bounded queue; `stats()` reports running, queued and rejected counts. Built
    once per server and shared by the middleware and the protocol's pass-through path, so both count
    against the same `max_concurrent`."""

    def __init__(self, *, max_concurrent: int = 256, max_queued: int = 4096, retry_after_s: float = 1.0,
                 max_wait_s: float | None = None) -> None:
        self.max_concurrent = max(1, max_concurrent)
        self.max_queued = max(0, max_queued)
        self.retry_after_s = retry_after_s
        self.max_wait_s = max_wait_s
        self.running = 0
        self.rejected = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def stats(self) -> dict[str, int]:
        return {"running": self.running, "queued": self.queued, "rejected": self.rejected}

    def try_acquire(self) -> bool:
        """Take a slot only if one is free now and nobody waits for it (a newcomer never jumps the line)."""
        if self.running < self.max_concurrent and not self._waiters:
            self.running += 1
            return True
        return False

    async def acquire(self) -> bool:
        """Take a slot, waiting in line if needed; False when the line is full or the wait too long."""
        if self.try_acquire():
            return True
        if len(self._waiters) >= self.max_queued:
            return False
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            if self.max_wait_s is None:
                await waiter
            else:
                await asyncio.wait_for(asyncio.shield(waiter), self.max_wait_s)
            return True  # the slot was handed over by release (running already counts it)
        except asyncio.TimeoutError:
            return self._give_up(waiter)
        except asyncio.CancelledError:  # the client went away while waiting
            if not self._give_up(waiter):
                raise
            self.release()  # the slot arrived as we were cancelled: pass it on
            raise

    def _give_up(self, waiter: asyncio.Future[None]) -> bool:
        """Leave the line; True if a slot had already been handed to this waiter."""
        if waiter.done() and not waiter.cancelled():
            return True
        waiter.cancel()
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass
        return False

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot goes straight to the oldest waiter
                return
        self.running -= 1


class AdmissionControl:
    """The queue in front of every handler but the exempt probes; a refusal is a 503 with Retry-After."""

    def __init__(self, app: ASGIApp, *, queue: AdmissionQueue, exempt_paths: frozenset[str] = EXEMPT_PATHS) -> None:
        self.app = app
        self.queue = queue
        self.exempt_paths = exempt_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt_paths:
            await self.app(scope, receive, send)
            return
        if not await self.queue.acquire():
            await self._refuse(scope, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.queue.release()

    async def _refuse(self, scope: Scope, send: Send) -> None:
        queue = self.queue
        queue.rejected += 1
        retry = max(1, math.ceil(queue.retry_after_s))  # Retry-After is whole seconds
        await send_json(send, 503, error_body(
            f"server busy: {queue.running} requests running and {queue.queued} queued (max_queued="
            f"{queue.max_queued}); retry after {retry}s", "overloaded", request_id_of(scope),
            retry_after_s=retry), extra_headers=[(b"retry-after", str(retry).encode())])


def admission_queue(config: Any) -> AdmissionQueue:
    """A server's admission queue, from its config's admission fields."""
    return AdmissionQueue(max_concurrent=config.max_concurrent_requests, max_queued=config.max_queued_requests,
                          retry_after_s=config.retry_after_s, max_wait_s=config.max_queue_wait_s)
