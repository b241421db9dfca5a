"""Async HTTP client for server-to-server calls.

Every call has a deadline that covers all its retries; only connection errors and
502/503/504 are retried, with exponential backoff and jitter, never sooner than a
reply's `Retry-After` (an overloaded server's bounded queue says when to come back) and
never past the deadline; auth and session ids are propagated. Plain calls go through aiohttp, which costs several times less CPU
per request than httpx at high concurrency (measured in benchmarks/agent_run.py);
`http` is an httpx client kept for the few callers that stream.
"""
from __future__ import annotations

import asyncio
import json as jsonlib
import random
import time
from typing import Any

import aiohttp
import httpx
from multidict import CIMultiDict

from .auth import auth_headers
from .errors import UpstreamError
from .failures import FailureKind

RETRY_STATUSES = frozenset({502, 503, 504})


class Reply:
    """A fully read reply: `status_code`, case-insensitive `headers`, `content`, `text`, `json()`."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: CIMultiDict[str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return jsonlib.loads(self.content)


class ServiceClient:
    """Pooled client with per-call deadlines and bounded retries."""

    def __init__(self, *, deadline_s: float = 60.0, retries: int = 3, backoff_s: float = 0.1,
                 backoff_max_s: float = 2.0, max_connections: int = 1024) -> None:
        self.deadline_s = deadline_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._http: httpx.AsyncClient | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._session_loop is not loop or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300,
                                             keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False,
                                                  skip_auto_headers=("User-Agent",))
            self._session_loop = loop
        return self._session

    @property
    def http(self) -> httpx.AsyncClient:
        """An httpx client for streamed calls (`http.send(request, stream=True)`)."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http_loop is not loop or self._http.is_closed:
            limits = httpx.Limits(max_connections=self.max_connections,
                                  max_keepalive_connections=self.max_connections)
            self._http = httpx.AsyncClient(limits=limits, timeout=None, trust_env=False)
            self._http_loop = loop
        return self._http

    async def aclose(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        if self._http is not None and not self._http.is_closed:
            await self._http.aclose()
        self._session = self._http = None

    def headers(self, headers: dict[str, str] | None = None, session_id: str | None = None,
                url: str | None = None) -> dict[str, str]:
        """Auth (only for a trusted origin, see `services.core.auth`) and session headers, plus `headers`."""
        merged = auth_headers(url or "")
        if session_id:
            merged["X-Session-Id"] = session_id
        if headers:
            merged.update(headers)
        return merged

    async def request(self, method: str, url: str, *, json: Any = None, content: bytes | None = None,
                      headers: dict[str, str] | None = None, session_id: str | None = None,
                      deadline_s: float | None = None, retries: int | None = None,
                      params: dict[str, Any] | None = None) -> Reply:
        """One call with retries; raises UpstreamError(kind=timeout|upstream) when it cannot succeed.

        4xx and other non-retryable statuses are returned to the caller unchanged.
        """
        budget = deadline_s if deadline_s is not None else self.deadline_s
        deadline = time.monotonic() + budget
        attempts = 1 + (self.retries if retries is None else retries)
        hdrs = self.headers(headers, session_id, url)
        data = content
        if json is not None:
            data = jsonlib.dumps(json, separators=(",", ":")).encode()
            hdrs.setdefault("Content-Type", "application/json")
        last = "no attempt made"
        for attempt in range(attempts):
            reply: Reply | None = None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                timeout = aiohttp.ClientTimeout(total=remaining, connect=min(remaining, 10.0))
                async with self.session.request(method, url, data=data, headers=hdrs, params=params,
                                                timeout=timeout, allow_redirects=False) as response:
                    reply = Reply(response.status, CIMultiDict(response.headers), await response.read())
            except aiohttp.ConnectionTimeoutError:  # the request never left: safe to try again
                last = f"connect timeout calling {url}"
            except asyncio.TimeoutError:  # sent, no answer in time: never re-sent
                raise UpstreamError(f"deadline exceeded calling {method} {url} (the {budget:g}s deadline)",
                                    kind=FailureKind.TIMEOUT) from None
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
                last = f"{type(exc).__name__} calling {url}: {exc}"
            except (aiohttp.ClientError, ValueError) as exc:  # ValueError: a malformed URL
                raise UpstreamError(f"{type(exc).__name__} calling {url}: {exc}") from None
            else:
                if reply.status_code not in RETRY_STATUSES:
                    return reply
                last = f"{url} answered {reply.status_code}: {reply.text[:300]}"
                if attempt + 1 == attempts:
                    raise UpstreamError(last, upstream_status=reply.status_code, body=reply.text[:2000])
            if attempt + 1 == attempts:
                raise UpstreamError(f"giving up after {attempts} attempts: {last}")
            delay = min(self.backoff_max_s, self.backoff_s * 2 ** attempt) * (0.5 + random.random())
            if reply is not None:  # an overloaded server says when to come back: not sooner
                delay = max(delay, retry_after(reply))
            if time.monotonic() + delay >= deadline:
                break  # no time left for another attempt: that is a timeout, not a verdict on the server
            await asyncio.sleep(delay)
        raise UpstreamError(f"deadline exceeded calling {method} {url} (the {budget:g}s deadline; {last})",
                            kind=FailureKind.TIMEOUT)

    async def post_json(self, url: str, payload: Any, **kwargs: Any) -> Any:
        """POST JSON and return the decoded JSON reply; a 4xx/5xx raises UpstreamError with its message."""
        return decode(await self.request("POST", url, json=payload, **kwargs), url)

    async def get_json(self, url: str, **kwargs: Any) -> Any:
        return decode(await self.request("GET", url, **kwargs), url)


def retry_after(reply: Reply) -> float:
    """Seconds a 503/429 reply asks the caller to wait (`Retry-After` in seconds; 0 when absent or a date)."""
    value = reply.headers.get("Retry-After", "").strip()
    try:
        return max(0.0, float(value)) if value else 0.0
    except ValueError:
        return 0.0  # an HTTP date: rare between our servers, fall back to the backoff


def decode(response: Reply, url: str) -> Any:
    if response.status_code >= 400:
        try:
            message = response.json().get("detail")
        except Exception:
            message = response.text[:500]
        raise UpstreamError(f"{url} answered {response.status_code}: {message}",
                            kind=FailureKind.BAD_REQUEST if 400 <= response.status_code < 500 else FailureKind.UPSTREAM,
                            upstream_status=response.status_code, body=response.text[:2000])
    try:
        return response.json()
    except ValueError:
        raise UpstreamError(f"{url} answered with invalid JSON: {response.text[:200]}") from None


_shared: ServiceClient | None = None


def shared_client() -> ServiceClient:
    """The process-wide pooled client."""
    global _shared
    if _shared is None:
        _shared = ServiceClient()
    return _shared
