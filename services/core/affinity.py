"""Session affinity across the replicas of a stateful resource server, and rebuilding a session
whose replica died.

A session id names the replica that issued it (`<replica id>.<random>`) and `/seed_session`
answers that replica's own address in `X-Gymserve-Replica`, so an agent sends every later call of
the session straight to its owner: no proxy hop per call. A call that reaches another replica
anyway (through Ray Serve's proxy, a compose or Kubernetes service, the head's proxy, a NeMo-Gym
caller that only holds the id) is forwarded once to the owner found in the replica registry.
When the owner does not answer (its process is gone), the replica that got the call rebuilds
the session from its journal (`journal.py`): it seeds it again from the row and replays every
tool call, checking that each reply equals the journaled one. An environment that cannot be
rebuilt, a journal that is missing, or a replay that answers differently is refused with 409 and
a `failure_kind` (`session_lost`, `session_diverged`) the agent masks the rollout with.

Without a journal directory (one process per server) nothing here changes a call's path.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response

from .auth import trust
from .client import shared_client
from .errors import Conflict, GymError, UpstreamError
from .failures import FailureKind
from .hosts import ANY_ADDRESSES, connect_url
from .journal import Journal, JournalEntry, JournalStore, Replica, safe_id

if TYPE_CHECKING:
    from .resource import Environment, Session

REPLICA_HEADER = "X-Gymserve-Replica"      # the owner's direct URL, on replies of a session's calls
FORWARDED_HEADER = "X-Gymserve-Forwarded"  # set on a forwarded call: it is never forwarded again
CALL_SEQ_HEADER = "X-Gymserve-Call-Seq"    # a tool call's number in its session (1, 2, ...): a repeat is not re-applied
SESSION_STORE_ENV = "GYMSERVE_SESSION_STORE"
REPLICA_HOST_ENV = "GYMSERVE_REPLICA_HOST"
FORWARD_HEADERS = ("content-type", "x-session-id", REPLICA_HEADER.lower(), "x-close-session", "set-cookie",
                   "retry-after")
log = logging.getLogger("gymserve.affinity")
R = TypeVar("R", bound=Response)


class SessionUnavailable(Conflict):
    """The session cannot be served here or rebuilt: the rollout is masked with `failure_kind`."""

    def __init__(self, message: str, kind: FailureKind) -> None:
        super().__init__(message, failure_kind=kind.value)
        self.kind = kind


def replica_host(bind_host: str) -> str:
    """The address peers and agents reach this replica at: `GYMSERVE_REPLICA_HOST` (a pod's IP), else the
    bind address, else (bound to every address, as in a container) the address its host name resolves to
    (a container's own, from the /etc/hosts Docker and Kubernetes write)."""
    chosen = os.environ.get(REPLICA_HOST_ENV)
    if chosen:
        return chosen
    if bind_host in ANY_ADDRESSES:
        name = socket.gethostname()
        try:
            return socket.gethostbyname(name)
        except OSError:
            return name
    return bind_host


class Affinity:
    """This replica's share of keeping each session on one replica."""

    def __init__(self, env: "Environment", store_dir: str | None) -> None:
        self.env = env
        # a server whose sessions hold no state (no tools, no seed of its own) is served as before: any
        # replica verifies any call, so a session id there needs no owner
        self.store = JournalStore(store_dir) if store_dir and env.stateful() else None
        self.replica_id = secrets.token_hex(6)
        self.url: str | None = None
        self._peers: dict[str, Replica] = {}
        self._peers_read = 0.0
        self._rebuilds: dict[str, asyncio.Task[Any]] = {}
        self.draining = False

    @property
    def enabled(self) -> bool:
        return self.store is not None

    def new_session_id(self) -> str:
        return f"{self.replica_id}.{secrets.token_urlsafe(24)}"

    @staticmethod
    def owner_of(sid: str) -> str | None:
        head, dot, _ = sid.partition(".")
        return head if dot else None

    # ---- the registry ---------------------------------------------------- #
    def announce(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.heartbeat()

    def heartbeat(self) -> None:
        if self.store is not None and self.url:
            with contextlib.suppress(OSError):
                self.store.register(Replica(self.replica_id, self.url, len(self.env.sessions), os.getpid(),
                                            time.time(), self.draining))

    async def drain(self, limit_s: float) -> None:
        """Stopping: take no new sessions, and keep serving the open ones that cannot be rebuilt elsewhere
        until they close or expire, for at most `limit_s` (journaled ones move to a peer on their next call)."""
        self.draining = True
        self.heartbeat()
        if self.env.rebuildable and self.enabled:
            return
        deadline = time.monotonic() + limit_s
        while self.env.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            self.env.session(None, required=False)  # expire idle ones
            self.heartbeat()

    def withdraw(self) -> None:
        if self.store is not None:
            self.store.unregister(self.replica_id)

    def peers(self) -> dict[str, Replica]:
        """Live replicas other than this one (re-read at most once a second)."""
        if self.store is None:
            return {}
        if time.monotonic() - self._peers_read > 1.0:
            self._peers = {k: v for k, v in self.store.replicas().items() if k != self.replica_id and v.alive}
            self._peers_read = time.monotonic()
        return self._peers

    def reply_headers(self, response: R) -> R:
        if self.url:
            response.headers[REPLICA_HEADER] = self.url
        return response

    # ---- where a new session goes ----------------------------------------- #
    def better_home(self) -> Replica | None:
        """A peer to seed on instead of here: this replica is full, or a peer holds clearly fewer sessions."""
        if self.store is None:
            return None
        mine = len(self.env.sessions)
        full = mine >= self.env.config.max_sessions or self.draining
        candidates = [p for p in self.peers().values()
                      if p.sessions < self.env.config.max_sessions and not p.draining]
        if not candidates:
            return None
        best = min(candidates, key=lambda p: p.sessions)
        if full or best.sessions + max(4, mine // 10) < mine:
            best.sessions += 1  # until its next heartbeat says how many it holds
            return best
        return None

    async def forward(self, request: Request, path: str, target: Replica) -> Response | None:
        """The call answered by `target`; None when `target` is gone (nothing answered)."""
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() in ("content-type", "x-session-id", "cookie", "x-close-session",
                                    CALL_SEQ_HEADER.lower())}
        headers[FORWARDED_HEADER] = "1"
        trust(target.url)  # a replica of this server, from the registry the replicas share: it gets our key
        try:
            reply = await shared_client().request(request.method, target.url + path, content=await request.body(),
                                                  headers=headers, retries=0, deadline_s=300.0)
        except UpstreamError as exc:
            if exc.kind == FailureKind.UPSTREAM and exc.upstream_status is None:
                self._peers.pop(target.id, None)
                return None
            raise
        out = Response(reply.content, status_code=reply.status_code)
        for key in FORWARD_HEADERS:
            for value in reply.headers.getall(key, []):
                out.headers.append(key, value)
        return out

    async def to_owner(self, request: Request, path: str, sid: str | None) -> Response | None:
        """The owner's answer to a call about session `sid` held by a live peer (a NeMo-Gym caller's seed
        or close by name carries the session's cookie); None when it is not a peer's."""
        if (sid is None or not self.enabled or sid in self.env.sessions
                or request.headers.get(FORWARDED_HEADER) == "1"):
            return None
        owner = (self.store.owner(sid) if self.store is not None and safe_id(sid) else None) or self.owner_of(sid)
        peer = self.peers().get(owner or "")
        return await self.forward(request, path, peer) if peer is not None else None

    # ---- finding a session ------------------------------------------------ #
    async def locate(self, request: Request, sid: str, path: str) -> "Session | Response | None":
        """The session held here, the owner's answer to the call, a session rebuilt here, or None (unknown)."""
        held = self.env.sessions.get(sid)
        if held is not None or self.store is None or not safe_id(sid) or self.owner_of(sid) is None:
            return held  # (an id of no replica of ours: no session, as on a single server)
        owner = self.store.owner(sid) or self.owner_of(sid)
        if owner and owner != self.replica_id and request.headers.get(FORWARDED_HEADER) != "1":
            peer = self.peers().get(owner)
            if peer is not None:
                forwarded = await self.forward(request, path, peer)
                if forwarded is not None:
                    return forwarded
        return await self.rebuild(sid, request, path)

    async def rebuild(self, sid: str, request: Request, path: str) -> "Session | Response":
        task = self._rebuilds.get(sid)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._rebuild(sid))
            self._rebuilds[sid] = task
            task.add_done_callback(lambda _t: self._rebuilds.pop(sid, None))
        result = await asyncio.shield(task)
        if isinstance(result, Replica):  # another replica rebuilt it first: it is the owner now
            forwarded = await self.forward(request, path, result)
            if forwarded is None:
                raise SessionUnavailable(f"session {sid!r} was rebuilt on a replica that is gone too",
                                         FailureKind.SESSION_LOST)
            return forwarded
        return result

    async def _rebuild(self, sid: str) -> "Session | Replica":
        assert self.store is not None
        store = self.store
        lock = await asyncio.to_thread(_acquire, store, sid)
        try:
            owner = store.owner(sid)
            if owner and owner != self.replica_id:
                peer = store.replicas().get(owner)
                if peer is not None and peer.alive and await _answers(peer.url):
                    return peer
            if not self.env.rebuildable:
                raise SessionUnavailable(f"unknown session {sid!r}: it was closed, expired, or its replica died, and "
                                         "this environment cannot rebuild a session elsewhere", FailureKind.SESSION_LOST)
            journal = store.read(sid)
            if journal is None:
                raise SessionUnavailable(f"unknown session {sid!r}: it was closed, expired, or its replica died "
                                         "before it was journaled; seed a new session", FailureKind.SESSION_LOST)
            sess = await self._replay(sid, journal)
            store.set_owner(sid, self.replica_id)
            log.info("rebuilt session %s from its journal (%d calls)", sid, len(journal.calls))
            return sess
        finally:
            lock.close()

    async def _replay(self, sid: str, journal: Journal) -> "Session":
        from .resource import Session

        env = self.env
        if not env.rebuildable or journal.nondeterministic:
            why = ("its environment cannot rebuild a session" if not env.rebuildable
                   else "it made calls a replay cannot repeat")
            raise SessionUnavailable(f"session {sid!r} was lost with its replica and {why}", FailureKind.SESSION_LOST)
        sess = Session(sid, {}, journal.external_id)
        try:
            await env.seed(sess, journal.row)
            tools = env.tools()
            for entry in journal.calls:
                status, reply = await call_recorded(tools[entry.name], sess, entry.arguments)
                if (status, reply) != (entry.status, entry.reply):
                    raise SessionUnavailable(
                        f"session {sid!r} could not be rebuilt: replaying call {entry.seq} ({entry.name}) answered "
                        f"differently than it did on the replica that died", FailureKind.SESSION_DIVERGED)
        except BaseException:
            await env.release(sess)
            raise
        sess.journal = list(journal.calls)
        sess.rebuilt = True
        env.sessions[sid] = sess
        if journal.external_id is not None:
            env.external[journal.external_id] = sid
        return sess

    # ---- journaling ----------------------------------------------------- #
    def started(self, sess: "Session", row: dict[str, Any]) -> None:
        if self.store is not None and self.env.rebuildable:
            self.store.start(sess.id, row, sess.external_id)

    def recorded(self, sess: "Session", request: Request) -> JSONResponse | None:
        """The journaled reply of a call the session already made (a retry after a lost reply)."""
        seq = _seq(request)
        if seq is None:
            return None
        for entry in sess.journal:
            if entry.seq == seq:
                return JSONResponse(entry.reply if entry.status < 400 else {"detail": entry.reply},
                                    status_code=entry.status)
        return None

    def record(self, sess: "Session", request: Request, name: str, arguments: dict[str, Any], status: int,
               reply: Any) -> None:
        if self.store is None or not self.env.rebuildable:
            return
        seq = _seq(request) or (sess.journal[-1].seq + 1 if sess.journal else 1)
        entry = JournalEntry(seq, name, arguments, status, reply)
        sess.journal.append(entry)
        self.store.record(sess.id, entry)

    def closed(self, sid: str) -> None:
        if self.store is not None:
            self.store.drop(sid)


async def call_recorded(fn: Any, sess: "Session", arguments: dict[str, Any]) -> tuple[int, Any]:
    """A tool call as (status, JSON reply): what the journal keeps and a replay compares."""
    try:
        result = await fn(sess, **arguments)
    except GymError as exc:
        return exc.status_code, exc.message
    return 200, jsonable_encoder(result)


def _seq(request: Request) -> int | None:
    raw = request.headers.get(CALL_SEQ_HEADER)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


class _Lock:
    def __init__(self, cm: Any) -> None:
        self.cm = cm

    def close(self) -> None:
        self.cm.__exit__(None, None, None)


def _acquire(store: JournalStore, sid: str) -> _Lock:
    cm = store.locked(sid)
    cm.__enter__()
    return _Lock(cm)


async def _answers(url: str) -> bool:
    try:
        await shared_client().request("GET", f"{url}/health", retries=0, deadline_s=5.0)
    except UpstreamError as exc:
        return exc.upstream_status is not None
    return True


async def start_direct_server(app: Any, host: str) -> tuple[Any, asyncio.Task[None], str]:
    """Serve `app` on its own port too (a Ray Serve replica's own address, next to Serve's proxy);
    the lifespan already ran in the replica, so this server skips it."""
    import uvicorn

    from .ports import free_port

    port = free_port(host if host not in ANY_ADDRESSES else "127.0.0.1")
    config = uvicorn.Config(app, host=host, port=port, lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve())
    for _ in range(200):
        if server.started or task.done():
            break
        await asyncio.sleep(0.05)
    if task.done():
        task.result()
    return server, task, connect_url(replica_host(host) if host in ANY_ADDRESSES else host, port)
