"""A warm pool of started workspaces per source (image or folder), so a session never waits for a cold start.

A workspace is handed out once and replaced in the background. Pooled workspaces older than
`max_age_s` (total lifetime) or idle longer than `idle_s` are destroyed and replaced; a source
nobody asked for in `idle_s` is not refilled (its pool drains to nothing).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any, Coroutine

from .workspace import Limits, Provider, Workspace

log = logging.getLogger("gymserve.sandbox")
Key = tuple[str | None, str | None]


class WorkspacePool:
    def __init__(self, provider: Provider, limits: Limits, *, size: int = 2, idle_s: float = 600.0,
                 max_age_s: float = 3600.0) -> None:
        self.provider = provider
        self.limits = limits
        self.size = size
        self.idle_s = idle_s
        self.max_age_s = max_age_s
        self.ready: dict[Key, list[tuple[float, Workspace]]] = {}
        self.wanted: dict[Key, float] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    async def take(self, *, image: str | None = None, folder: Path | None = None) -> Workspace:
        """A started workspace of this source: a pooled one when ready, else a cold one."""
        key = (image, str(folder) if folder else None)
        self.wanted[key] = time.monotonic()
        now = time.monotonic()
        found: Workspace | None = None
        queue = self.ready.setdefault(key, [])
        while queue and found is None:
            born, ws = queue.pop(0)
            if now - born < self.max_age_s:
                found = ws
            else:
                self._spawn(ws.destroy())
        if self.size > 0:
            self._spawn(self._refill(key))
        if found is not None:
            return found
        return await self.provider.create(image=image, folder=folder, limits=self.limits)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _refill(self, key: Key) -> None:
        queue = self.ready.setdefault(key, [])
        while not self.closed and len(queue) < self.size and time.monotonic() - self.wanted[key] < self.idle_s:
            try:
                ws = await self.provider.create(image=key[0], folder=Path(key[1]) if key[1] else None,
                                                limits=self.limits)
            except Exception as exc:  # served cold meanwhile; the next take tries again
                log.warning("could not pre-start a workspace: %s", exc)
                return
            if self.closed:
                await ws.destroy()
                return
            queue.append((time.monotonic(), ws))

    async def expire(self) -> int:
        """Destroy pooled workspaces past their lifetime or of sources idle too long; returns how many."""
        now, gone = time.monotonic(), 0
        for key, queue in self.ready.items():
            idle = now - self.wanted.get(key, 0.0) >= self.idle_s
            keep = [(born, ws) for born, ws in queue if not idle and now - born < self.max_age_s]
            for item in queue:
                if item not in keep:
                    await item[1].destroy()
                    gone += 1
            queue[:] = keep
        return gone

    async def run_expiry(self, every_s: float = 30.0) -> None:
        while not self.closed:
            await asyncio.sleep(every_s)
            await self.expire()

    async def close(self) -> None:
        self.closed = True
        for task in list(self.tasks):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for queue in self.ready.values():
            for _, ws in queue:
                await ws.destroy()
        self.ready.clear()
