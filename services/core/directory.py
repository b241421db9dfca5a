"""Resolve server instance names to URLs through the head's `/server_instances`.

Agents, the trainer client and the head's adapters find each other by instance name,
so a restarted or moved server is found again (call `invalidate` after a failure).
"""
from __future__ import annotations

import time
from typing import Any

from .client import ServiceClient, shared_client
from .errors import UpstreamError
from .failures import FailureKind


class Directory:
    def __init__(self, head_url: str | None, *, static: dict[str, str] | None = None,
                 client: ServiceClient | None = None, ttl_s: float = 10.0) -> None:
        self.head_url = head_url.rstrip("/") if head_url else None
        self.static = dict(static or {})
        self.client = client or shared_client()
        self.ttl_s = ttl_s
        self._cache: dict[str, dict[str, Any]] = {}
        self._fetched = 0.0

    async def instances(self, *, refresh: bool = False) -> dict[str, dict[str, Any]]:
        if self.head_url and (refresh or time.monotonic() - self._fetched > self.ttl_s):
            rows = await self.client.get_json(f"{self.head_url}/server_instances", deadline_s=10.0)
            self._cache = {row["name"]: row for row in rows if isinstance(row, dict) and "name" in row}
            self._fetched = time.monotonic()
        return self._cache

    async def url(self, name: str) -> str:
        """Base URL of instance `name`; refreshes once from the head before giving up."""
        if name in self.static:
            return self.static[name].rstrip("/")
        if not self.head_url:
            raise UpstreamError(f"cannot resolve server {name!r}: no head URL (set GYMSERVE_HEAD_URL)",
                                kind=FailureKind.UPSTREAM)
        found = (await self.instances()).get(name) or (await self.instances(refresh=True)).get(name)
        if not found:
            raise UpstreamError(f"no server named {name!r} is registered with the head at {self.head_url}",
                                kind=FailureKind.UPSTREAM, status_code=502)
        return str(found["url"]).rstrip("/")

    def invalidate(self, name: str | None = None) -> None:
        """Forget cached locations (all, or one name) so the next lookup asks the head."""
        if name is None:
            self._fetched = 0.0
        else:
            self._cache.pop(name, None)
