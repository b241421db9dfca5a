"""A mounted app served straight from the protocol, below the ASGI stack, for ordinary requests.

A server whose hot path only passes bytes on (the head's `/servers/` proxy) spent about a third of
its CPU per request in the layers around that path: the ASGI server's request cycle, FastAPI's and
Starlette's wrappers and the ten shared middleware layers, each one a coroutine frame that every
resumption of the request walks through. On a machine the servers behind the head keep busy, that
CPU is their throughput. So the protocol (`services.core.serving`) hands a request whose whole body
has arrived to the mounted app directly, when nothing about it needs those layers to decide.

Anything else goes the ordinary way, through every layer, which answers it as it always did: a
missing or wrong key, a body over the limit or nested too deep, a full admission queue, a body
still arriving, `Expect`, an upgrade, `X-Forwarded-*` headers, a pipelined request. The refusals
keep one implementation; this path repeats only what every answered request gets: a request id,
the metrics, an admission slot, a disconnect that cancels it, and the JSON error replies.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from starlette.types import ASGIApp, Message

from .auth import api_key, authorized
from .errors import GymError, counted_failure, error_body, gym_error_body
from .metrics import Metrics
from .middleware.admission import AdmissionQueue
from .middleware.disconnect import DisconnectHooks
from .middleware.input_guard import json_depth_exceeds
from .middleware.reply import send_json
from .middleware.request_id import new_request_id

log = logging.getLogger("gymserve")

_REQUEST_ID = b"x-request-id"
# a request carrying one of these goes the ordinary way: the ASGI server answers `expect` and reads
# `x-forwarded-*` (from trusted proxies), a streamed body is counted against the limit as it comes
_ORDINARY_WAY = frozenset({b"expect", b"upgrade", b"transfer-encoding", b"x-forwarded-for", b"x-forwarded-proto"})


def _header(scope: Mapping[str, Any], name: bytes) -> bytes | None:
    return next((v for k, v in scope["headers"] if k == name), None)


class PassThrough:
    """`app` served at the path template `template` (`/servers/{name}/{path:path}`: every path that starts
    with its literal part; the template is the metrics label) for the requests it `takes` and `admits`."""

    def __init__(self, template: str, app: ASGIApp, *, metrics: Metrics, admission: AdmissionQueue,
                 max_body_bytes: int, max_json_depth: int) -> None:
        self.prefix = template.split("{", 1)[0]
        self.route = SimpleNamespace(path=template)
        self.app = app
        self.metrics = metrics
        self.admission = admission
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth
        self.served = 0  # requests answered this way (the rest went through the layers)

    def takes(self, scope: Mapping[str, Any]) -> bool:
        """Whether the request may come this way, judged by its head (its body has not arrived yet)."""
        if scope.get("root_path") or not scope["path"].startswith(self.prefix):
            return False
        for name, value in scope["headers"]:
            if name in _ORDINARY_WAY:
                return False
            if name == b"content-length" and not (value.isdigit() and int(value) <= self.max_body_bytes):
                return False
        return True

    def admits(self, scope: Mapping[str, Any], body: bytes | bytearray) -> bool:
        """Whether the request, its whole body in, passes every check the layers would make; True takes
        its admission slot (released when `serve` ends)."""
        key = api_key()
        if key and not authorized(_decoded(_header(scope, b"authorization")), key):
            return False
        if len(body) > self.max_body_bytes or (body and json_depth_exceeds(body, self.max_json_depth)):
            return False
        return self.admission.try_acquire()

    async def serve(self, cycle: Any, hooks: DisconnectHooks) -> None:
        """Run the app for an admitted request. `cycle` is the ASGI server's request cycle (its `scope`,
        `receive` and `send`, the whole body already in it); `hooks` is told when the connection is lost."""
        scope = cycle.scope
        started = time.perf_counter()
        self.served += 1
        given = _header(scope, _REQUEST_ID)
        request_id = given.decode("latin-1") if given else new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        scope["route"] = self.route
        stamp = (_REQUEST_ID, request_id.encode("latin-1", "replace"))
        status = 0

        async def send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), stamp]
            await cycle.send(message)

        task = asyncio.current_task()
        assert task is not None
        gone = False

        def cut() -> None:
            nonlocal gone
            if not cycle.response_complete:
                gone = True
                task.cancel()

        hooks.callbacks.append(cut)
        self.metrics.in_flight.inc()
        unanswered = 500
        try:
            await self.app(scope, cycle.receive, send)
            if not status:
                raise RuntimeError("the app returned without replying")
        except asyncio.CancelledError:
            unanswered = 499
            if not gone:  # the server is stopping: pass it on
                raise
            if hasattr(task, "uncancel"):
                task.uncancel()
        except GymError as exc:
            if status:
                self._broken(scope, exc, cycle)
            else:
                self.metrics.failure(counted_failure(exc))
                await send_json(send, exc.status_code, gym_error_body(exc, request_id))
        except Exception as exc:
            if status:
                self._broken(scope, exc, cycle)
            else:
                log.exception("unhandled error on %s %s", scope["method"], scope["path"])
                self.metrics.failure("crash")
                await send_json(send, 500, error_body(
                    f"internal error: {type(exc).__name__}: {exc}", "internal_error", request_id))
        finally:
            hooks.callbacks.remove(cut)
            self.admission.release()
            self.metrics.in_flight.dec()
            self.metrics.served(scope["method"], self.route.path, status or unanswered, time.perf_counter() - started)
        if status and not cycle.response_complete and not cycle.disconnected:
            cycle.transport.close()  # a reply cut short: the client must not take it for whole

    def _broken(self, scope: dict[str, Any], exc: Exception, cycle: Any) -> None:
        """An error after the reply had started: all that is left is to cut the connection."""
        log.error("error on %s %s after its reply started: %s: %s", scope["method"], scope["path"],
                  type(exc).__name__, exc)
        self.metrics.failure("crash")
        cycle.transport.close()


def _decoded(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None
