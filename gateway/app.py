"""The head server: registry, redacted config, reverse proxy, aggregated health, dashboard,
training curves.

`gymserve up` starts it first with the resolved stack in GYMSERVE_SERVER_SPEC; it can
also run alone (`gymserve serve head stack_files=[deploy/stacks/x.yaml]`), with
servers started elsewhere registering themselves through `POST /register`.
"""
from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import Field, ValidationError, field_validator

from services.core.app import create_app, read_json
from services.core.auth import api_key, trust
from services.core.config import (DEFAULT_HEAD_PORT, ConfigError, ServerConfig, Stack, describe_validation_error,
                                  interpolate, load_stack, redact)
from services.core.errors import BadRequest, GymError, NotFound
from services.core.hosts import connect_host, connect_url, is_loopback
from services.core.openapi import describe, list_of
from services.core.registration import STACK_TOKEN_ENV, STACK_TOKEN_HEADER

from . import dashboard
from .health import HealthMonitor
from .nemo_gym import AGENT_TYPE, environment_servers, with_references
from .proxy import Proxy
from . import registration_rules as rules
from .registry import Registration, Registry
from .schemas import HealthReport, Registered, ServerInstance, Unregistered, UnregisterRequest
from .training import TrainingLog, TrainingStep

MAX_TRAINING_BATCH = 1000
PROXY_ROUTE = "/servers/{name}/{path:path}"
STATIC_CACHE = "public, max-age=86400"  # a day: the files change only with the installed package


class Config(ServerConfig):
    name: str = "head"
    kind: str = "head"
    port: int = Field(DEFAULT_HEAD_PORT, ge=0, le=65535)
    stack: dict[str, Any] | None = Field(None, description="the stack (what `gymserve up` passes)")
    stack_files: list[str] = Field(default_factory=list, description="stack YAML files to read instead")
    openrlhf_environment: str | None = Field(None, description="resource server that POST /get_reward uses")
    health_interval_s: float = Field(5.0, gt=0, description="how often servers are sampled for health")
    probe_timeout_s: float = Field(3.0, gt=0, description="longest wait for one server's /ready or /metrics")
    proxy_connect_timeout_s: float = Field(10.0, gt=0)
    proxy_read_timeout_s: float = Field(600.0, gt=0, description="longest silence the proxy waits for")
    # the head only forwards (each server queues its own work): it lets more requests through at once
    max_concurrent_requests: int = Field(1024, gt=0, description="requests handled at once; more wait in order")
    cpu_policy: Literal["normal", "batch"] = Field(
        "batch", description="Linux scheduling policy (see every server's option): the head only forwards, so on "
        "cores it shares with the servers behind it, their work does not wait for its wakeups")
    allowed_hosts: list[str] = Field(default_factory=rules.allowed_hosts,
                                     description="hosts (names, IPs, CIDRs) a registered server may live on")
    max_registered: int = Field(256, gt=0, description="servers registered beyond the stack; more get 429")
    training_max_bytes: int = Field(64 * 1024 * 1024, ge=64 * 1024, description="what the head keeps of "
                                    "POST /training/metrics records, as JSON; beyond it the oldest steps go")

    @field_validator("stack_files", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


def resolve_stack(config: Config) -> Stack:
    if config.stack is not None and config.stack_files:
        raise ConfigError("head options: give either stack or stack_files, not both")
    if config.stack_files:
        stack = load_stack(config.stack_files)
    else:
        stack = load_stack(base=config.stack or {})
    for name, spec in stack.servers.items():
        spec.options = interpolate(spec.options, where=f"servers.{name}")
    return stack


def global_config(config: Config, stack: Stack, registry: Registry) -> dict[str, Any]:
    """NeMo-Gym's global config shape: `head_server` plus `{instance: {server_type: {impl: {...}}}}`.

    NeMo-Gym clients find a server's host/port by walking exactly this shape; 0.7.0's collector
    also needs an environment server in front of each agent (`gateway/nemo_gym.py`).
    """
    out: dict[str, Any] = {"head_server": {"host": connect_host(config.host), "port": config.port,
                                           "url": connect_url(config.host, config.port)}}
    if stack.head.openrlhf_environment or config.openrlhf_environment:
        out["head_server"]["openrlhf_environment"] = config.openrlhf_environment or stack.head.openrlhf_environment
    agents = []
    for inst in registry.instances():
        impl = inst.kind.rsplit("/", 1)[-1] or inst.name
        address = {"host": inst.host, "port": inst.port, "url": inst.url}
        out[inst.name] = {inst.server_type: {impl: {"kind": inst.kind, **address, **with_references(inst.options)}}}
        if inst.server_type == AGENT_TYPE:
            agents.append((inst.name, impl, address))
    out.update(environment_servers(agents, taken=set(out)))
    return redact(out)


def build(config: Config) -> FastAPI:
    if not is_loopback(config.host) and api_key() is None:
        raise ConfigError(f"host: the head binds {config.host or 'every interface'} without a bearer key; set "
                          "GYMSERVE_API_KEY or GYMSERVE_API_KEY_FILE (`gymserve up` and `make compose-up` "
                          "generate one), or bind it to 127.0.0.1")
    stack = resolve_stack(config)
    config = config.model_copy(update={"head_url": None})  # the head does not register with itself
    registry = Registry(stack, stack_token=os.environ.get(STACK_TOKEN_ENV) or None,
                        max_registered=config.max_registered, trusted_hosts=rules.network_hosts())
    proxy = Proxy(registry.get, connect_timeout_s=config.proxy_connect_timeout_s,
                  read_timeout_s=config.proxy_read_timeout_s)
    monitor = HealthMonitor(registry.instances, interval_s=config.health_interval_s,
                            probe_timeout_s=config.probe_timeout_s)
    head_url = connect_url(config.host, config.port)

    app = create_app(config, server_type="head_server", on_startup=[monitor.start],
                     on_shutdown=[proxy.aclose, monitor.stop], mounts={PROXY_ROUTE: proxy},
                     description="gymserve head: registry, config, proxy, health")
    app.state.registry = registry
    training = TrainingLog(max_bytes=config.training_max_bytes)

    @app.post("/register", **describe(body=Registration, reply=Registered, errors=(403, 409, 422, 429),
                                      summary="A server announces itself (and heartbeats)"))
    async def register(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > rules.MAX_REGISTRATION_BYTES:
            raise BadRequest(f"body: a registration of {len(raw)} bytes; at most {rules.MAX_REGISTRATION_BYTES}",
                             status_code=413)
        body = await read_json(request)
        if not isinstance(body, dict):
            raise BadRequest("registration must be a JSON object with name, host and port")
        try:
            reg = Registration.model_validate(body)
        except ValidationError as exc:
            raise BadRequest(f"invalid registration: {describe_validation_error(exc)}", status_code=422) from None
        rules.check_extras(reg.model_extra or {})
        token = request.headers.get(STACK_TOKEN_HEADER)
        static = registry.get(reg.name)
        if not (static is not None and static.static and token):  # the stack's own launcher is trusted
            where = {}
            if reg.url:
                parts = urlsplit(reg.url)
                try:
                    port = parts.port or (443 if parts.scheme == "https" else 80)
                except ValueError:
                    raise BadRequest(f"url: {reg.url!r} has no valid port", status_code=422) from None
                where["url"] = (parts.hostname or "", port)
            where["host"] = (reg.host, reg.port)
            for field, (host, port) in where.items():
                await asyncio.to_thread(rules.check_address, field, host, port, rules=config.allowed_hosts,
                                        head_port=config.port, head_names={config.name.lower(), "head"})
        inst = registry.register(reg, stack_token=token)
        return {"status": "registered", "name": inst.name, "url": inst.url, "ttl_s": reg.ttl_s,
                "lease": registry.lease_for(inst, stack_token=token)}

    @app.post("/unregister", **describe(body=UnregisterRequest, reply=Unregistered, errors=(403, 404)))
    async def unregister(request: Request) -> dict[str, Any]:
        body = await read_json(request)
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise BadRequest("expected {\"name\": \"<instance>\", \"lease\": \"<lease>\"}")
        lease = body.get("lease") if isinstance(body.get("lease"), str) else None
        if not registry.unregister(name, lease=lease, stack_token=request.headers.get(STACK_TOKEN_HEADER)):
            raise NotFound(f"no server named {name!r} is registered")
        return {"status": "unregistered", "name": name}

    @app.get("/server_instances", **describe(reply=list_of(ServerInstance)))
    async def server_instances() -> list[dict[str, Any]]:
        return redact(registry.rows())

    @app.get("/server_instances/{name}", **describe(reply=ServerInstance, errors=(404, 422)))
    async def server_instance(name: str) -> dict[str, Any]:
        for row in registry.rows():
            if row["name"] == name:
                return redact(row)
        raise NotFound(f"no server named {name!r} is registered with the head")

    @app.get("/global_config_dict_yaml", **describe(
        reply={"type": "string", "description": "the resolved config as YAML (secrets redacted)"}))
    async def global_config_dict_yaml() -> JSONResponse:
        text = yaml.safe_dump(global_config(config, stack, registry), sort_keys=False, default_flow_style=False)
        return JSONResponse(text)

    def head_info() -> dict[str, Any]:
        return {"name": config.name, "url": head_url, "status": "ok"}

    async def health_report() -> dict[str, Any]:
        rows = await monitor.probe_all()
        return {"head": head_info(),
                "ready": sum(1 for r in rows if r["healthy"]), "total": len(rows), "servers": rows}

    @app.get("/health/servers", **describe(reply=HealthReport))
    async def health_servers() -> dict[str, Any]:
        return await health_report()

    @app.get("/status", **describe(reply=HealthReport))
    async def status() -> dict[str, Any]:
        return await health_report()

    async def latest_rows() -> list[dict[str, Any]]:
        """The last probe round (the monitor samples on a timer); a fresh round only before the first."""
        rows = monitor.last_rows()
        return rows if rows is not None else await monitor.probe_all()

    @app.get("/dashboard", response_class=HTMLResponse,
             **describe(reply={"type": "string"}, reply_media="text/html"))
    async def dashboard_page() -> HTMLResponse:
        return HTMLResponse(dashboard.render(head_info(), await latest_rows(), refresh_s=config.health_interval_s))

    data_cache: dict[str, Any] = {"key": None, "body": b""}

    @app.get("/dashboard/data")
    async def dashboard_data() -> Response:
        """Built once per probe round and training update, however many pages poll it."""
        rows = await latest_rows()
        key = (monitor.sampled_at, training.version)
        if data_cache["key"] != key:
            data = dashboard.payload(head_info(), rows, monitor, training, refresh_s=config.health_interval_s)
            data_cache.update(key=key, body=JSONResponse(data).body)
        return Response(data_cache["body"], media_type="application/json")

    @app.get("/dashboard/static/{name}", include_in_schema=False)
    async def dashboard_static(name: str) -> Response:
        media_type = dashboard.STATIC_FILES.get(name)
        if media_type is None:
            raise NotFound(f"no dashboard file named {name!r}")
        return Response((dashboard.STATIC_DIR / name).read_bytes(), media_type=media_type,
                        headers={"Cache-Control": STATIC_CACHE})

    @app.post("/training/metrics", **describe(
        body={"anyOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}],
              "description": "one trainer step record {step, reward, kl, ...} or a list of them"},
        reply={"type": "object"}, errors=(422,)))
    async def post_training_metrics(request: Request) -> dict[str, Any]:
        """One trainer step record (or a list of them) for the dashboard's training charts."""
        body = await read_json(request)
        items = body if isinstance(body, list) else [body]
        if len(items) > MAX_TRAINING_BATCH:
            raise BadRequest(f"body: {len(items)} records in one request; send at most {MAX_TRAINING_BATCH}")
        steps = []
        for i, item in enumerate(items):
            where = f"item {i}: " if isinstance(body, list) else ""
            if not isinstance(item, dict):
                raise BadRequest(f"{where}expected a JSON object with step, reward, kl, ...")
            try:
                steps.append(TrainingStep.model_validate(item))
            except ValidationError as exc:
                raise BadRequest(f"{where}invalid training record: {describe_validation_error(exc)}",
                                 status_code=422) from None
        for step in steps:
            training.add(step)
        return {"status": "recorded", "records": len(steps), "runs": training.runs()}

    @app.get("/training/metrics", **describe(reply={"type": "object"}, errors=(404, 422)))
    async def get_training_metrics(run: str | None = None) -> dict[str, Any]:
        if run is not None and run not in training.runs():
            raise NotFound(f"no training run named {run!r} (runs: {', '.join(training.runs()) or 'none'})")
        return {"runs": training.runs(), "records": training.records(run)}

    # The proxy itself is a plain ASGI app mounted in front of FastAPI's routing (see `Proxy`); these
    # routes put it in the OpenAPI schema and are never reached.
    async def proxy_route(name: str, path: str) -> Response:
        raise GymError(f"/servers/{name}/{path} is served by the head's proxy mount, not by this route")

    for method in ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"):
        app.add_api_route(PROXY_ROUTE, proxy_route, methods=[method],
                          operation_id=f"proxy_{method.lower()}", **describe(
                              body={"description": "passed on unchanged"} if method in ("POST", "PUT", "PATCH") else None,
                              body_required=False, reply={"description": "the server's own reply"},
                              errors=(404, 422, 502, 504, 508), passes_4xx=True,
                              summary="Reverse proxy to a registered server"))

    async def resolve_url(name: str) -> str:
        inst = registry.get(name)
        if inst is None:
            raise NotFound(f"no server named {name!r} is registered with the head")
        if inst.trusted:
            trust(inst.url)  # the head's own calls (OpenRLHF's /get_reward) carry the key to it
        return inst.url

    if importlib.util.find_spec("gateway.openrlhf") is not None:
        openrlhf = importlib.import_module("gateway.openrlhf")
        openrlhf.add_routes(app, resolve_url, config.openrlhf_environment or stack.head.openrlhf_environment)
    return app
