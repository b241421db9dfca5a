"""Resolve server instance names to URLs through the head's `/server_instances`.

Agents, the trainer client and the head's adapters find each other by instance name,
so a restarted or moved server is found again (call `invalidate` after a failure).

A client outside the servers' network (a trainer on the host of a compose stack, whose
servers registered as `http://math_simple_agent:8000`) cannot use those URLs. With
`via_head="auto"` each server is probed once at its direct URL; when that does not resolve
or connect, calls go through the head's reverse proxy (`/servers/{name}`) instead. The
decision is cached per server and made again after `invalidate`.
"""
from __future__ import annotations

import time
from typing import Any, Literal

from .auth import trust
from .client import ServiceClient, shared_client
from .errors import UpstreamError
from .failures import FailureKind


def instance_name(row: dict[str, Any]) -> str | None:
    """A `/server_instances` row's instance name. A NeMo-Gym 0.7.0 head's rows name the instance in
    `config_path` (`math_simple_agent`) and the implementation in `name` (`simple_agent`); ours
    carry the instance name in both."""
    name = row.get("config_path") or row.get("name")
    return name if isinstance(name, str) and name else None


class Directory:
    def __init__(self, head_url: str | None, *, static: dict[str, str] | None = None,
                 client: ServiceClient | None = None, ttl_s: float = 10.0,
                 via_head: Literal["never", "auto"] = "never", probe_s: float = 3.0) -> None:
        self.head_url = head_url.rstrip("/") if head_url else None
        self.static = dict(static or {})
        for url in [self.head_url or "", *self.static.values()]:
            trust(url)  # the key goes to the head and to configured URLs, not to self-registered ones
        self.client = client or shared_client()
        self.ttl_s = ttl_s
        self.via_head = via_head
        self.probe_s = probe_s
        self._cache: dict[str, dict[str, Any]] = {}
        self._fetched = 0.0
        self._routes: dict[str, tuple[str, str]] = {}  # name -> (direct URL, URL to use)

    async def instances(self, *, refresh: bool = False) -> dict[str, dict[str, Any]]:
        if self.head_url and (refresh or time.monotonic() - self._fetched > self.ttl_s):
            rows = await self.client.get_json(f"{self.head_url}/server_instances", deadline_s=10.0)
            named = ((instance_name(row), row) for row in rows if isinstance(row, dict))
            self._cache = {name: row for name, row in named if name}
            for row in self._cache.values():
                if (row.get("trusted") or row.get("static")) is True and isinstance(row.get("url"), str):
                    trust(row["url"])  # started by the stack (or on its own network)
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
        return await self.route(name, str(found["url"]).rstrip("/"))

    async def route(self, name: str, direct: str) -> str:
        """The URL to call server `name` at: `direct`, or the head's proxy when `direct` is unreachable
        from here (only with via_head="auto"; the choice is cached per server)."""
        if self.via_head != "auto" or not self.head_url or name in self.static:
            return direct
        cached = self._routes.get(name)
        if cached and cached[0] == direct:
            return cached[1]
        chosen = direct if await self._reachable(direct) else f"{self.head_url}/servers/{name}"
        self._routes[name] = (direct, chosen)
        return chosen

    async def _reachable(self, url: str) -> bool:
        """Any HTTP answer counts (even 401 or 503): only a name that does not resolve or a
        connection that fails makes the head's proxy the way in."""
        try:
            await self.client.request("GET", f"{url}/health", deadline_s=self.probe_s, retries=0)
        except UpstreamError as exc:
            return exc.upstream_status is not None
        return True

    def invalidate(self, name: str | None = None) -> None:
        """Forget cached locations and routes (all, or one name) so the next lookup asks the head."""
        if name is None:
            self._fetched = 0.0
            self._routes.clear()
        else:
            self._cache.pop(name, None)
            self._routes.pop(name, None)
