"""Reply models of the head's endpoints, for its OpenAPI schema (`/docs`, `/openapi.json`)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ServerInstance(_Open):
    """One row of `GET /server_instances` (NeMo-Gym's fields plus gymserve's)."""

    name: str
    server_type: str
    kind: str
    host: str
    port: int
    url: str
    pid: int | None = None
    status: str = Field(description="registered (heartbeat alive), stale (heartbeat ran out) or configured")
    static: bool = Field(description="listed in the stack file rather than only registered")
    trusted: bool = Field(False, description="the stack's own (static, or on its network): the head and servers "
                                              "send the bearer key to it")
    heartbeat_age_s: float | None = None


class Registered(_Open):
    status: str
    name: str
    url: str
    ttl_s: float | None = None
    lease: str | None = Field(None, description="send it with every heartbeat and with POST /unregister")


class UnregisterRequest(_Open):
    name: str
    lease: str | None = Field(None, description="the lease POST /register returned")


class Unregistered(_Open):
    status: str
    name: str


class HealthReport(_Open):
    """`GET /status` and `GET /health/servers`: every server probed now."""

    head: dict[str, Any]
    ready: int
    total: int
    servers: list[dict[str, Any]]


class OpenRLHFRequest(_Open):
    """OpenRLHF's remote reward protocol: full texts (prompt + response) with optional prompts and labels."""

    query: list[str] | str
    prompts: list[str] | None = None
    labels: list[Any] | None = None
    environment: str | None = Field(None, description="resource server to score with (default: the stack's)")


class OpenRLHFReply(_Open):
    rewards: list[float]
    scores: list[float]
    extra_logs: dict[str, Any]
