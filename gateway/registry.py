"""The head's registry: instances from the stack plus servers that register themselves.

Stack instances are static: they stay listed even while down (the launcher restarts
them on the same port). Servers started elsewhere `POST /register` with a TTL and
repeat it as a heartbeat; one whose TTL runs out drops out of the list.

Nobody can take over a name: a static instance keeps its stack address unless the
registration carries the stack token (what `gymserve up` hands its own children and
its Ray launcher), and a registered name belongs to its first registrant, whose
heartbeats and unregister carry the lease returned by the first `POST /register`. A lease is
handed only to the registrant that owns it: a stack name's to the holder of the stack token,
never to a key holder who registers the name at its stack address.
"""
from __future__ import annotations

import hmac
import secrets
import time
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.core.app import server_type_name
from services.core.errors import GymError
from services.core.hosts import connect_url
from services.core.bindings import binding_urls
from services.core.config import Stack
from services.core.loader import is_package_kind

from .nemo_gym import instance_fields

SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "head_server")


class Registration(BaseModel):
    """Body of `POST /register` (what `services.core.registration` sends)."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")
    server_type: str | None = Field(None, description="NeMo-Gym server type; derived from kind if absent")
    kind: str = Field("", max_length=200)
    host: str = Field(min_length=1, max_length=255)
    port: int = Field(ge=1, le=65535)
    # printable ASCII only: the URL is written into the head's upstream requests as it is (IDN hosts in punycode)
    url: str | None = Field(None, max_length=1000, pattern=r"^https?://[!-~]+$")
    pid: int | None = Field(None, ge=1)
    ttl_s: float = Field(15.0, gt=0, le=86400)
    lease: str | None = Field(None, max_length=200, description="the lease a first registration returned")

    @model_validator(mode="before")
    @classmethod
    def _host_port_from_url(cls, data: Any) -> Any:
        """`{name, url}` is enough: host and port are taken from the URL when not given."""
        if isinstance(data, dict) and isinstance(data.get("url"), str) and ("host" not in data or "port" not in data):
            try:
                parts = urlsplit(data["url"])
                default_port = 443 if parts.scheme == "https" else 80
                data = {"host": parts.hostname, "port": parts.port or default_port, **data}
            except ValueError:
                pass  # the url field's own validation reports it
        return data


class Instance:
    """One known server."""

    def __init__(self, name: str, kind: str, host: str, port: int, *, server_type: str | None = None,
                 url: str | None = None, static: bool = False, options: dict[str, Any] | None = None) -> None:
        self.name = name
        self.kind = kind
        self.host = host
        self.port = port
        self.server_type = server_type or server_type_name(kind)
        self.url = (url or connect_url(host, port)).rstrip("/")
        self.static = static
        self.options = dict(options or {})
        self.pid: int | None = None
        self.expires: float | None = None  # monotonic time the last heartbeat runs out
        self.registered_at: float | None = None
        self.started_at = time.time()  # reset when another process registers under the name
        self.extra: dict[str, Any] = {}
        self.lease: str | None = None
        self.trusted = static  # the bearer key may be sent to it (a server of the stack or its network)

    def alive(self, now: float) -> bool:
        return self.expires is not None and now < self.expires

    def status(self, now: float) -> str:
        if self.alive(now):
            return "registered"
        return "stale" if self.expires is not None else "configured"

    def row(self, now: float) -> dict[str, Any]:
        return {
            **self.extra,
            "name": self.name,
            "server_type": self.server_type,
            "kind": self.kind,
            "host": self.host,
            "port": self.port,
            "url": self.url,
            "pid": self.pid,
            "status": self.status(now),
            "static": self.static,
            "trusted": self.trusted,
            "heartbeat_age_s": None if self.registered_at is None else round(time.time() - self.registered_at, 3),
            "start_time": self.started_at,
            **self.binding_urls(),
            **instance_fields(self.name),
        }

    def binding_urls(self) -> dict[str, str]:
        """`openenv_url` and `mcp_url` of one of our resource servers (every one has both bindings): what it
        registered, else derived from its address, so a stack's servers list them before their first heartbeat."""
        if self.server_type != "resources_servers" or not (self.kind.startswith("resources/")
                                                           or is_package_kind(self.kind)):
            return {}
        return {**binding_urls(self.url), **{k: self.extra[k] for k in ("openenv_url", "mcp_url") if k in self.extra}}


class Refused(GymError):
    """A registration or unregister the registry will not take (403, 409 or 429)."""

    error_type = "registration_refused"


def _same(given: str | None, expected: str | None) -> bool:
    return bool(given and expected and hmac.compare_digest(given.encode(), expected.encode()))


class Registry:
    def __init__(self, stack: Stack | None = None, *, stack_token: str | None = None,
                 max_registered: int = 256, trusted_hosts: frozenset[str] = frozenset()) -> None:
        self._instances: dict[str, Instance] = {}
        self.stack_token = stack_token
        self.max_registered = max_registered
        self.trusted_hosts = trusted_hosts  # the stack's own network names (compose services, k8s services)
        if stack is not None:
            for name, spec in stack.servers.items():
                self._instances[name] = Instance(name, spec.kind, spec.host, spec.port, static=True,
                                                 options=spec.options)

    def register(self, reg: Registration, *, stack_token: str | None = None) -> Instance:
        """Add or refresh an instance. A static one is re-pointed only with the stack token; a registered
        name only by the holder of its lease (until its TTL runs out). Raises `Refused`."""
        now = time.monotonic()
        self.expire()
        inst = self._instances.get(reg.name)
        url = (reg.url or connect_url(reg.host, reg.port)).rstrip("/")
        if inst is not None and inst.static:
            if _same(stack_token, self.stack_token):
                inst.kind = reg.kind or inst.kind
                inst.host, inst.port, inst.url = reg.host, reg.port, url
                if reg.server_type:
                    inst.server_type = reg.server_type
            elif (reg.host, reg.port) != (inst.host, inst.port) and url != inst.url:
                raise Refused(f"name: {reg.name!r} is a server of the head's stack at {inst.url}; "
                                   "a registration cannot point it elsewhere", status_code=403)
        elif inst is not None:
            if not _same(reg.lease, inst.lease):
                raise Refused(f"name: {reg.name!r} is registered by another server until its heartbeat "
                                   "runs out; heartbeats need the lease its first registration returned", status_code=409)
            inst.kind, inst.host, inst.port, inst.url = reg.kind, reg.host, reg.port, url
            if reg.server_type:
                inst.server_type = reg.server_type
        else:
            if sum(1 for i in self._instances.values() if not i.static) >= self.max_registered:
                raise Refused(f"the registry is full ({self.max_registered} registered servers); "
                                   "unregister one or wait for a heartbeat to run out", status_code=429)
            inst = Instance(reg.name, reg.kind, reg.host, reg.port, server_type=reg.server_type, url=reg.url)
            self._instances[reg.name] = inst
        if inst.lease is None:
            inst.lease = reg.lease if not inst.static and reg.lease else secrets.token_urlsafe(24)
        url_host = (urlsplit(inst.url).hostname or "").lower()
        inst.trusted = inst.static or (inst.host.lower() in self.trusted_hosts and url_host in self.trusted_hosts)
        if reg.pid is not None and reg.pid != inst.pid:
            inst.started_at = time.time()
        inst.pid = reg.pid
        inst.expires = now + reg.ttl_s
        inst.registered_at = time.time()
        inst.extra = {k: v for k, v in (reg.model_extra or {}).items() if isinstance(k, str)}
        return inst

    def lease_for(self, inst: Instance, *, stack_token: str | None = None) -> str | None:
        """The lease a registration that just succeeded gets back: a registered name's to its registrant
        (who proved it by the lease, or came first), a stack name's only with the stack token."""
        if inst.static and not _same(stack_token, self.stack_token):
            return None
        return inst.lease

    def unregister(self, name: str, *, lease: str | None = None, stack_token: str | None = None) -> bool:
        """Drop `name` (a static one is only marked stale); needs its lease or the stack token."""
        inst = self._instances.get(name)
        if inst is None:
            return False
        if not (_same(lease, inst.lease) or _same(stack_token, self.stack_token)):
            raise Refused(f"lease: unregistering {name!r} needs the lease its registration returned", status_code=403)
        if inst.static:
            inst.expires = time.monotonic()  # listed as stale until it registers again
        else:
            del self._instances[name]
        return True

    def expire(self) -> None:
        now = time.monotonic()
        for name in [n for n, i in self._instances.items() if not i.static and not i.alive(now)]:
            del self._instances[name]

    def get(self, name: str) -> Instance | None:
        self.expire()
        return self._instances.get(name)

    def instances(self) -> list[Instance]:
        self.expire()
        return list(self._instances.values())

    def rows(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [inst.row(now) for inst in self.instances()]
