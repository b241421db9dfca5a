"""The shared shape of a resource server (an environment).

An environment subclasses `Environment`, implements `verify`, and optionally
declares tools with `@tool` and per-session state with `seed`. `create_resource_app`
turns it into a server with `/seed_session`, `/verify`, `/verify/batch`,
`/aggregate_metrics`, `/close_session` and `POST /{tool_name}`.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import secrets
import time
from collections import OrderedDict
from typing import Any, Awaitable, Callable, ClassVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Field, ValidationError

from .affinity import (FORWARDED_HEADER, SESSION_STORE_ENV, Affinity, SessionUnavailable, call_recorded,
                       replica_host, start_direct_server)
from .app import SESSION_COOKIE, create_app, read_json, session_id
from .config import ServerConfig, describe_validation_error
from .errors import BadRequest, Conflict, GymError, TooManyRequests, Unavailable
from .hosts import connect_url
from .journal import JournalEntry
from .failures import FailureKind
from .metrics import Metrics
from .metrics_agg import aggregate_metrics
from .openapi import SESSION_HEADER, describe, list_of
from .pool import TaskError, WorkerFailure, WorkerPool
from .replies import conform, exception_reply, failed_reply
from .schemas import (AggregateRequest, CloseSessionReply, CloseSessionRequest, SeedSessionReply,
                      VerifyReply, VerifyRequest, example_verify_body)

ToolFn = Callable[..., Awaitable[Any]]
# `/verify` with this header set to 1 closes the session after judging it and echoes the header back.
CLOSE_SESSION_HEADER = "X-Close-Session"
log = logging.getLogger("gymserve.resource")


def tool(fn: ToolFn) -> ToolFn:
    """Mark an async method `async def name(self, session, **arguments)` as tool `POST /name`."""
    fn.__gym_tool__ = True  # type: ignore[attr-defined]
    return fn


class ResourceConfig(ServerConfig):
    """Options every environment has."""

    workers: int = Field(0, ge=0, description="worker processes for CPU-heavy checks; 0 = one per core")
    verify_deadline_s: float = Field(10.0, gt=0, description="hard deadline of one check in a worker")
    max_queue: int = Field(4096, gt=0, description="bounded queue of pending checks (backpressure)")
    use_pool: bool = Field(True, description="start the worker pool (environments that need it)")
    session_ttl_s: float = Field(600.0, gt=0, description="idle sessions are dropped (and their resources freed) "
                                                          "after this")
    max_sessions: int = Field(1024, gt=0, description="open sessions (per replica); a /seed_session beyond gets 429 "
                                                      "when no replica has room")
    max_batch_items: int = Field(4096, gt=0, description="largest /verify/batch accepted")
    session_store: str | None = Field(
        default_factory=lambda: os.environ.get(SESSION_STORE_ENV) or None,
        description="directory shared by the replicas of this server: session journals and the replica registry "
                    "(sessions on a replica that dies are rebuilt elsewhere); unset: one process, no journal")
    drain_s: float = Field(
        default_factory=lambda: float(os.environ.get("GYMSERVE_DRAIN_S") or 0),
        ge=0, description="on a graceful stop of a replica with its own address: keep serving its open sessions "
                          "that cannot be rebuilt elsewhere for up to this long, taking no new ones")
    direct_host: str | None = Field(
        default_factory=lambda: os.environ.get("GYMSERVE_DIRECT_HOST") or None,
        description="also serve on a port of this address of our own (a Ray Serve replica's direct address)")


class Session:
    """Per-session state of a stateful environment.

    `id` is issued by the server (unguessable) and is the caller's proof of ownership: only a caller
    that was given it can use, verify against or close the session. `external_id` is the
    `resources_session_id` a NeMo-Gym Environment Server named the session with, if any.
    """

    def __init__(self, session_id: str, data: dict[str, Any], external_id: str | None = None) -> None:
        self.id = session_id
        self.data = data
        self.external_id = external_id
        self.touched = time.monotonic()
        self.lock = asyncio.Lock()
        # set when the session is closed or expires: a call that was waiting for `lock` must not
        # start anything for it then (nothing would ever release it, outside `max_sessions`)
        self.closed = False
        self.journal: list[JournalEntry] = []  # tool calls with their replies, when the server journals
        self.rebuilt = False  # rebuilt from its journal after its replica died


def new_session_id() -> str:
    """A session id no caller can guess or choose (192 random bits)."""
    return secrets.token_urlsafe(24)


class Environment:
    """Base of every environment. Subclass, set `config_model`, implement `verify`."""

    config_model: ClassVar[type[ResourceConfig]] = ResourceConfig
    needs_pool: ClassVar[bool] = False
    description: ClassVar[str] = ""
    # The wire contract of `/verify` in the OpenAPI schema: the row fields this environment reads
    # (a VerifyRequest subclass), the fields its reply adds (a VerifyReply subclass), and an example
    # row plus a model answer for `/docs`.
    request_model: ClassVar[type[VerifyRequest]] = VerifyRequest
    reply_model: ClassVar[type[VerifyReply]] = VerifyReply
    example_row: ClassVar[dict[str, Any]] = {}
    # `GET /reverify_mode` (NeMo-Gym 0.7.0's `gym eval reverify` asks before re-scoring recorded
    # rollouts): "stateless" when `/verify` is a pure function of its body, so a recorded rollout
    # scores again the same; "unknown" (its default) otherwise, e.g. a verifier that asks a judge
    REVERIFY_MODES: ClassVar[tuple[str, ...]] = ("stateless", "unsupported", "unknown")
    reverify_mode: ClassVar[str] = "unknown"
    # `GET /reward_scope`: "item" when `/verify` scores a rollout alone; "group" when the reward is
    # defined over a GRPO group (e.g. pairwise comparisons), so the trainer client re-scores each
    # finished group through `/verify/batch` (trainer/group_rewards.py)
    REWARD_SCOPES: ClassVar[tuple[str, ...]] = ("item", "group")
    reward_scope: ClassVar[str] = "item"
    # A session can be rebuilt on another replica by seeding it again and replaying its tool calls:
    # true only for an environment whose seed and tools are deterministic functions of the row and
    # the calls (no clock, no randomness, no outside world)
    rebuildable: ClassVar[bool] = False
    example_answer: ClassVar[str] = ""

    def __init__(self, config: ResourceConfig) -> None:
        self.config = config
        self.pool: WorkerPool | None = None
        self.sessions: dict[str, Session] = {}
        # NeMo-Gym's caller-named sessions: resources_session_id -> our id, and the names closed
        # recently (a seed after its close must not recreate the session), oldest first.
        self.external: dict[str, str] = {}
        self.closed_external: OrderedDict[str, float] = OrderedDict()
        self.metrics: Metrics | None = None  # the server's metrics, set when the app is built
        self.affinity = Affinity(self, config.session_store)

    # ---- hooks an environment may override -------------------------------- #
    async def startup(self) -> None:
        if self.needs_pool and self.config.use_pool:
            self.pool = await WorkerPool(
                self.config.workers or None, deadline_s=self.config.verify_deadline_s,
                max_queue=self.config.max_queue, name=f"{self.config.name}-pool",
                initializer=self.worker_initializer(),
            ).start()

    async def shutdown(self) -> None:
        if self.pool:
            await self.pool.close()
        self.affinity.withdraw()
        for sid in list(self.sessions):
            sess = self._forget(sid, journal=not self.affinity.enabled)  # journaled sessions move to a peer
            if sess is not None:
                await self.release(sess)

    def worker_initializer(self) -> Callable[[], Any] | None:
        """A module-level function each worker runs once (import heavy libraries here)."""
        return None

    def ready(self) -> bool:
        return self.pool is None or self.pool.ready

    def parse_row(self, request: VerifyRequest) -> Any:
        """The request as `request_model`, the row's task fields typed; a bad row is a 400 naming the field."""
        if isinstance(request, self.request_model):
            return request
        try:
            return self.request_model.model_validate({**(request.model_extra or {}), "response": request.response,
                                                      "responses_create_params": request.responses_create_params})
        except ValidationError as exc:
            raise BadRequest(describe_validation_error(exc)) from None

    def stateful(self) -> bool:
        """Whether a session holds state: the environment has tools or seeds sessions itself."""
        return bool(self.tools()) or type(self).seed is not Environment.seed

    def ready_details(self) -> dict[str, Any]:
        """Extra fields for `/ready` (e.g. how the environment is isolated)."""
        return {}

    async def seed(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        """Fill `session.data` from the row; the reply is merged into `/seed_session`'s answer."""
        return {}

    async def release(self, session: Session) -> None:
        """Free what a session holds (processes, files)."""

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        raise NotImplementedError

    def aggregate(self, body: Any) -> dict[str, Any]:
        """`/aggregate_metrics`: the shared statistics; override to add environment-specific keys."""
        return aggregate_metrics(body)

    async def verify_many(self, requests: list[VerifyRequest]) -> list[VerifyReply]:
        """Batch verify; each item fails on its own. Override to batch smarter."""
        return list(await asyncio.gather(*(self.safe_verify(r, None) for r in requests)))

    # ---- shared machinery ------------------------------------------------- #
    async def in_pool(self, fn: Callable[..., Any], *args: Any, deadline_s: float | None = None) -> Any:
        """Run `fn(*args)` in the worker pool (or inline if the pool is disabled, e.g. for debugging)."""
        if self.pool is None:
            return fn(*args)
        return await self.pool.run(fn, *args, deadline_s=deadline_s)

    async def safe_verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        """`verify` with infrastructure failures turned into masked replies, never a fabricated 0."""
        try:
            return await self.verify(request, session)
        except Exception as exc:  # a verifier bug must fail its own batch item, not the whole batch
            if not isinstance(exc, (GymError, WorkerFailure, TaskError)):
                log.exception("verify raised")
            return exception_reply(request, exc)

    async def checked_verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        """`verify` for one `/verify` call: a worker that timed out or crashed is a masked reply; a
        GymError keeps its HTTP status (bad input is a 4xx the caller can fix, overload a 503 it can
        retry), and a bug in the environment is a 500 that `gymserve check` and the fuzz tests catch."""
        try:
            return await self.verify(request, session)
        except (WorkerFailure, TaskError) as exc:
            return exception_reply(request, exc)

    def session(self, sid: str | None, *, required: bool) -> Session | None:
        self._expire_sessions()
        if sid is None:
            if required:
                raise BadRequest("no session id: call /seed_session first and pass its session_id "
                                 "as the X-Session-Id header or the gymserve_session cookie")
            return None
        found = self.sessions.get(sid)
        if found is None and required:
            raise Conflict(f"unknown session {sid!r}: it was closed, expired, or this server restarted; "
                           "seed a new session")
        if found:
            found.touched = time.monotonic()
        return found

    def _expire_sessions(self) -> None:
        now = time.monotonic()
        cutoff = now - self.config.session_ttl_s
        for sid in [s for s, sess in self.sessions.items() if sess.touched < cutoff]:
            sess = self._forget(sid)
            if sess is not None:
                asyncio.get_running_loop().create_task(self.release(sess))
        while self.closed_external and (next(iter(self.closed_external.values())) < cutoff
                                        or len(self.closed_external) > 4 * self.config.max_sessions):
            self.closed_external.popitem(last=False)

    def _forget(self, sid: str, *, journal: bool = True) -> Session | None:
        sess = self.sessions.pop(sid, None)
        if sess is not None:
            sess.closed = True
        if journal:
            self.affinity.closed(sid)
        if sess is not None and sess.external_id is not None:
            self.external.pop(sess.external_id, None)
            self.closed_external[sess.external_id] = time.monotonic()
        return sess

    def open_session(self, external_id: str | None = None) -> Session:
        """A new session under a fresh server-issued id; 429 when `max_sessions` are open."""
        self._expire_sessions()
        if len(self.sessions) >= self.config.max_sessions:
            raise TooManyRequests(f"too many open sessions (max_sessions={self.config.max_sessions}); close finished "
                                  f"ones with /close_session or wait for idle ones to expire "
                                  f"(session_ttl_s={self.config.session_ttl_s:g})")
        sid = self.affinity.new_session_id() if self.affinity.enabled else new_session_id()
        sess = Session(sid, {}, external_id)
        self.sessions[sess.id] = sess
        if external_id is not None:
            self.external[external_id] = sess.id
        return sess

    async def close_session(self, sid: str) -> bool:
        sess = self._forget(sid)
        if sess is None:
            return False
        await self.release(sess)
        return True

    async def sweep_sessions(self) -> None:
        """Expire idle sessions even when no request comes (frees interpreters and memory), and tell the
        replica registry how many sessions this replica holds."""
        period = min(30.0, self.config.session_ttl_s / 4)
        beat = 2.0 if self.affinity.enabled else period
        last = time.monotonic()
        while True:
            await asyncio.sleep(min(beat, period))
            self.affinity.heartbeat()
            if time.monotonic() - last >= period:
                self._expire_sessions()
                last = time.monotonic()

    async def find_session(self, request: Request, path: str, *, required: bool) -> Session | Response | None:
        """The request's session: held here, answered by the replica that holds it (a Response), or rebuilt
        here from its journal; a session that is gone is a 409 naming why."""
        sid = session_id(request)
        found = self.session(sid, required=required and (sid is None or not self.affinity.enabled))
        if found is not None or sid is None or not self.affinity.enabled:
            return found
        located = await self.affinity.locate(request, sid, path)
        if located is None and required:
            raise SessionUnavailable(f"unknown session {sid!r}: it was closed, expired, or this server restarted; "
                                     "seed a new session", FailureKind.SESSION_LOST)
        if isinstance(located, Session):
            located.touched = time.monotonic()
        return located

    def tool_parameters(self, name: str, fn: ToolFn) -> dict[str, Any]:
        """JSON schema of a tool's arguments (the request body of `POST /name`): from its signature
        by default; an environment with richer specs overrides this."""
        props: dict[str, dict[str, Any]] = {p.name: {} for p in list(inspect.signature(fn).parameters.values())[1:]
                 if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        return {"type": "object", "properties": props, "additionalProperties": False}

    def tools(self) -> dict[str, ToolFn]:
        found = {}
        for name, member in inspect.getmembers(type(self), inspect.iscoroutinefunction):
            if getattr(member, "__gym_tool__", False):
                found[name] = getattr(self, name)
        return found

    def describe_tools(self) -> list[dict[str, Any]]:
        """`{name, description, parameters}` of every tool: what `POST /{name}`, the OpenEnv binding's
        reset observation and the MCP binding's `tools/list` all describe."""
        return [{"name": name, "description": " ".join((fn.__doc__ or "").split()),
                 "parameters": self.tool_parameters(name, fn)} for name, fn in self.tools().items()]

    async def invoke_tool(self, sess: Session, name: str, arguments: Any) -> Any:
        """Call tool `name` on `sess` (one call at a time per session): the one path of `POST /{name}`,
        an OpenEnv tool step and an MCP `tools/call`. Bad arguments are a 400 naming the tool."""
        fn = self.tools().get(name)
        if fn is None:
            raise BadRequest(f"tool: no tool named {name!r} (tools: {', '.join(sorted(self.tools())) or 'none'})")
        arguments = {} if arguments is None else arguments
        if not isinstance(arguments, dict):
            raise BadRequest(f"tool {name}: arguments must be a JSON object")
        required = [key for key in self.tool_parameters(name, fn).get("required", []) if isinstance(key, str)]
        missing = [key for key in required if key not in arguments]
        if missing:
            raise BadRequest(f"tool {name}: missing required argument(s): {', '.join(missing)}")
        async with sess.lock:
            if sess.closed:
                raise Conflict(f"session {sess.id!r} was closed while this call waited for the one before it")
            try:
                return await fn(sess, **arguments)
            except TypeError as exc:
                if "argument" in str(exc):
                    raise BadRequest(f"tool {name}: {exc}") from None
                raise


def _parse_verify(body: Any, where: str = "body") -> VerifyRequest:
    if not isinstance(body, dict):
        raise BadRequest(f"{where}: expected a JSON object with responses_create_params and response")
    try:
        return VerifyRequest.model_validate(body)
    except ValidationError as exc:
        raise BadRequest(f"{where}: {describe_validation_error(exc)}") from None


def _external_id(body: dict[str, Any]) -> str:
    name = body.get("resources_session_id")
    if not isinstance(name, str) or not name:
        raise BadRequest("resources_session_id: expected a non-empty string")
    return name


def create_resource_app(env: Environment) -> FastAPI:
    """A resource server for `env`."""
    config = env.config
    sweeper: list[asyncio.Task[None]] = []

    async def start_sweeper() -> None:
        sweeper.append(asyncio.get_running_loop().create_task(env.sweep_sessions()))

    async def stop_sweeper() -> None:
        for task in sweeper:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    direct: list[Any] = []

    async def start_affinity() -> None:
        """Journaled replicas announce their own address; a Ray replica first gets one (a port of its own)."""
        if not env.affinity.enabled:
            return
        if config.direct_host:
            server, task, url = await start_direct_server(app, config.direct_host)
            direct.extend([server, task])
            env.affinity.announce(url)
        elif config.port:
            env.affinity.announce(connect_url(replica_host(config.host), config.port))

    async def stop_affinity() -> None:
        if direct and config.drain_s > 0:  # only the replica's own address still answers now
            await env.affinity.drain(config.drain_s)
        env.affinity.withdraw()
        if direct:
            direct[0].should_exit = True
            with contextlib.suppress(Exception):
                await asyncio.wait_for(direct[1], 10.0)

    app = create_app(config, on_startup=[env.startup, start_sweeper, start_affinity],
                     on_shutdown=[env.shutdown, stop_sweeper, stop_affinity],  # run last to first
                     readiness=env.ready, description=env.description, ready_details=env.ready_details)
    metrics = app.state.metrics
    app.state.env = env
    env.metrics = metrics

    def count(reply: VerifyReply) -> VerifyReply:
        """Every verify reply passes here: conformed to the environment's reply model; masked ones
        count by failure kind, judged ones by reward."""
        reply = conform(reply, env.reply_model)
        metrics.failure(reply.failure_kind)
        if not reply.mask_sample:
            metrics.reward(reply.reward)
        return reply

    verify_example = {"example": example_verify_body(env.example_row, env.example_answer)} if env.example_row else None

    @app.post("/seed_session", **describe(
        body={"type": "object", "description": "the dataset row; its task fields seed the session"},
        body_required=False, reply=SeedSessionReply, errors=(409, 429, 503),
        summary="Start a session for a row (stateful environments)",
        examples={"example": env.example_row} if env.example_row else None))
    async def seed_session(request: Request) -> Response:
        body = await read_json(request, allow_empty=True)
        if body is not None and not isinstance(body, dict):
            raise BadRequest("body: expected a JSON object (the dataset row)")
        if isinstance(body, dict) and "resources_session_id" in body:
            owned = await env.affinity.to_owner(request, "/seed_session", session_id(request))
            return owned if owned is not None else await _seed_named(request, body)
        if request.headers.get(FORWARDED_HEADER) != "1":
            home = env.affinity.better_home()  # full here, or a peer holds clearly fewer sessions
            if home is not None:
                forwarded = await env.affinity.forward(request, "/seed_session", home)
                if forwarded is not None and forwarded.status_code != 429:
                    return forwarded
        if env.affinity.draining:
            raise Unavailable("this replica is stopping and takes no new sessions; seed again")
        # The id is always issued here: a caller cannot choose one, nor reset another caller's session.
        sess = env.open_session()
        extra = await _seed(sess, body or {})
        env.affinity.started(sess, body or {})
        return _with_session(JSONResponse({"session_id": sess.id, **(extra or {})}), sess)

    async def _seed(sess: Session, row: dict[str, Any]) -> dict[str, Any]:
        try:
            return await env.seed(sess, row)
        except Exception:  # never opened: the caller may seed the same name again with a fixed row
            env.sessions.pop(sess.id, None)
            if sess.external_id is not None:
                env.external.pop(sess.external_id, None)
            await env.release(sess)
            raise

    async def _seed_named(request: Request, body: dict[str, Any]) -> JSONResponse:
        """NeMo-Gym's Environment-Server seed: the caller names the session (`resources_session_id`); a repeated
        seed by the same caller returns it, a seed after its close is refused, another caller gets 409."""
        name = _external_id(body)
        env.session(None, required=False)  # expire idle sessions first
        if name in env.closed_external:
            raise Conflict(f"resources_session_id: session {name!r} was closed; seed a new one")
        existing = env.external.get(name)
        if existing is not None:
            if session_id(request) != existing:
                raise Conflict(f"resources_session_id: session {name!r} belongs to another caller")
            sess = env.sessions[existing]
        else:
            task_data = body.get("task_data", {})
            if not isinstance(task_data, dict):
                raise BadRequest("task_data: expected a JSON object (the dataset row)")
            sess = env.open_session(name)
            await _seed(sess, task_data)
            env.affinity.started(sess, task_data)
        return _with_session(JSONResponse({"resources_session_id": name}), sess)

    def _with_session(response: JSONResponse, sess: Session) -> JSONResponse:
        response.set_cookie(SESSION_COOKIE, sess.id, httponly=True, samesite="lax")
        response.headers["X-Session-Id"] = sess.id
        return env.affinity.reply_headers(response)

    @app.post("/verify", **describe(
        body=env.request_model, reply=env.reply_model, errors=(503,), examples=verify_example,
        parameters=[SESSION_HEADER], summary="Judge one rollout: the request echoed back plus the reward"))
    async def verify(request: Request) -> Response:
        parsed = _parse_verify(await read_json(request))
        sess = await env.find_session(request, "/verify", required=False)
        if isinstance(sess, Response):
            return sess  # answered by the replica that holds the session
        reply = await env.checked_verify(parsed, sess)
        # a JSONResponse skips FastAPI's jsonable_encoder pass over an already JSON-ready dict (hot path)
        response = JSONResponse(count(reply).dump())
        if sess is not None and request.headers.get(CLOSE_SESSION_HEADER) == "1":
            # the agent's last call of a rollout: saves it a /close_session round trip
            await env.close_session(sess.id)
            response.headers[CLOSE_SESSION_HEADER] = "1"
        return response

    @app.post("/verify/batch", **describe(
        body={"anyOf": [list_of(env.request_model),
                        {"type": "object", "required": ["requests"],
                         "properties": {"requests": list_of(env.request_model)}}]},
        reply=list_of(env.reply_model), summary="Judge many rollouts; each item fails on its own",
        examples={"example": [verify_example["example"]]} if verify_example else None))
    async def verify_batch(request: Request) -> JSONResponse:
        body = await read_json(request)
        items = body.get("requests") if isinstance(body, dict) else body
        if not isinstance(items, list):
            raise BadRequest("body: expected a JSON list of verify requests (or {\"requests\": [...]})")
        if len(items) > config.max_batch_items:
            raise BadRequest(f"body: {len(items)} items exceeds max_batch_items={config.max_batch_items}")
        parsed: list[VerifyRequest | None] = []
        errors: dict[int, str] = {}
        for i, item in enumerate(items):
            try:
                parsed.append(_parse_verify(item, f"item {i}"))
            except BadRequest as exc:
                parsed.append(None)
                errors[i] = exc.message
        valid = [p for p in parsed if p is not None]
        results = iter(await env.verify_many(valid))
        out = []
        for i, p in enumerate(parsed):
            if p is None:
                raw = items[i] if isinstance(items[i], dict) else {"item": items[i]}
                out.append(count(failed_reply(raw, FailureKind.BAD_REQUEST, errors[i])).dump())
            else:
                out.append(count(next(results)).dump())
        return JSONResponse(out)

    @app.post("/aggregate_metrics", **describe(body=AggregateRequest, reply={"type": "object"},
                                               summary="Statistics over verify replies"))
    async def aggregate(request: Request) -> dict[str, Any]:
        return env.aggregate(await read_json(request))

    @app.get("/reverify_mode", **describe(reply={"type": "string", "enum": list(env.REVERIFY_MODES)},
                                          summary="Whether recorded rollouts can be re-verified"))
    async def reverify_mode() -> str:
        return env.reverify_mode

    @app.get("/reward_scope", **describe(reply={"type": "string", "enum": list(env.REWARD_SCOPES)},
                                         summary="Whether the reward is defined per rollout or per GRPO group"))
    async def reward_scope() -> str:
        return env.reward_scope

    @app.post("/close_session", **describe(body=CloseSessionRequest, body_required=False, reply=CloseSessionReply,
                                           errors=(409,), parameters=[SESSION_HEADER], summary="Free a session"))
    async def close_session(request: Request) -> dict[str, Any]:
        body = await read_json(request, allow_empty=True)
        if isinstance(body, dict) and "resources_session_id" in body:
            owned = await env.affinity.to_owner(request, "/close_session", session_id(request))
            return owned if owned is not None else await _close_named(request, body)  # type: ignore[return-value]
        sid = session_id(request) or (body.get("session_id") if isinstance(body, dict) else None)
        if not sid:
            raise BadRequest("no session id to close (X-Session-Id header, cookie, or body.session_id)")
        if not isinstance(sid, str):
            raise BadRequest(f"session_id: expected a string, got {type(sid).__name__}")
        if sid not in env.sessions and env.affinity.enabled:
            owner = env.affinity.peers().get(env.affinity.owner_of(sid) or "")
            if owner is not None and request.headers.get(FORWARDED_HEADER) != "1":
                forwarded = await env.affinity.forward(request, "/close_session", owner)
                if forwarded is not None:
                    return forwarded  # type: ignore[return-value]
            env.affinity.closed(sid)  # its replica is gone: its journal goes too
        return {"session_id": sid, "closed": await env.close_session(sid)}

    async def _close_named(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        """NeMo-Gym's close: idempotent, succeeds for a name never seeded, and keeps a later seed of that
        name from recreating it; only the caller holding the session may close an open one."""
        name = _external_id(body)
        existing = env.external.get(name)
        if existing is not None and session_id(request) != existing:
            raise Conflict(f"resources_session_id: session {name!r} belongs to another caller")
        if existing is not None:
            await env.close_session(existing)
        env.closed_external[name] = time.monotonic()
        env.closed_external.move_to_end(name)
        env.session(None, required=False)  # bound the closed names
        return {"resources_session_id": name}

    for name, fn in env.tools().items():
        _add_tool_route(app, env, name, fn)
    from .bindings import mount_bindings  # the OpenEnv and MCP faces of the same environment

    mount_bindings(app, env, count)
    return app


def _add_tool_route(app: FastAPI, env: Environment, name: str, fn: ToolFn) -> None:
    parameters = env.tool_parameters(name, fn)
    required = [key for key in parameters.get("required", []) if isinstance(key, str)]

    async def call_tool(request: Request) -> Any:
        arguments = await read_json(request, allow_empty=True)
        arguments = {} if arguments is None else arguments
        if not isinstance(arguments, dict):
            raise BadRequest(f"tool {name}: arguments must be a JSON object")
        missing = [key for key in required if key not in arguments]
        if missing:  # before the session: the caller learns what its call lacks first
            raise BadRequest(f"tool {name}: missing required argument(s): {', '.join(missing)}")
        sess = await env.find_session(request, f"/{name}", required=True)
        if isinstance(sess, Response):
            return sess  # answered by the replica that holds the session
        assert sess is not None
        if not env.affinity.enabled:
            return await env.invoke_tool(sess, name, arguments)
        async with sess.lock:
            if sess.closed:
                raise Conflict(f"session {sess.id!r} was closed while this call waited for the one before it")
            return await _journaled(sess, request, arguments)

    async def _journaled(sess: Session, request: Request, arguments: dict[str, Any]) -> Any:
        """The call applied once and journaled before its reply leaves; a repeat gets the journaled reply."""
        repeat = env.affinity.recorded(sess, request)
        if repeat is not None:
            return env.affinity.reply_headers(repeat)
        try:
            status, reply = await call_recorded(fn, sess, arguments)
        except TypeError as exc:
            if "argument" in str(exc):
                raise BadRequest(f"tool {name}: {exc}") from None
            raise
        env.affinity.record(sess, request, name, arguments, status, reply)
        if status >= 400:
            raise {400: BadRequest, 409: Conflict}.get(status, GymError)(reply, status_code=status)
        return env.affinity.reply_headers(JSONResponse(reply))

    app.add_api_route(f"/{name}", call_tool, methods=["POST"], name=name, description=(fn.__doc__ or "").strip(),
                      tags=["tools"], **describe(body=parameters, body_required=False,
                                                 reply={"description": "the tool's JSON result"},
                                                 errors=(409, 503), parameters=[SESSION_HEADER]))
