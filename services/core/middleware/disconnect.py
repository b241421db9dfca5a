"""A request whose client has gone away is cancelled instead of worked to the end.

Nobody reads its reply: a rollout the trainer cut at its batch deadline would otherwise keep the agent,
the model and the resource server busy, and a server being stopped would wait out its graceful-shutdown
time for it. The cancellation travels down the chain: the agent's own calls close their connections, so
the servers behind it notice the same way.

Every gymserve server's protocol says when a connection is lost, to the requests on it; elsewhere the
client is watched only once the handler has read the whole body (the watch must not take a body chunk
from it). A reply already sent is never cancelled.
"""
from __future__ import annotations

import asyncio
from typing import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .reply import reply_of


DISCONNECT_EXTENSION = "gymserve.disconnect"


class DisconnectHooks:
    """What a connection calls when it is lost: put into each request's scope (its `extensions`) by the
    protocol every gymserve server is served with (`services.core.serving`), so a request is cut the
    moment its connection goes, with no task per request waiting for the `http.disconnect` message."""

    __slots__ = ("callbacks",)

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def lost(self) -> None:
        for callback in list(self.callbacks):
            callback()


class DisconnectMiddleware:
    """Outside every layer but the reply's record: runs the request in the server's own task and cancels
    that task when the client disconnects. The request itself is not moved to a task of its own. Under
    gymserve's protocol the connection says when it is lost (`DisconnectHooks`); under another server
    (Ray Serve's proxy, a test's plain uvicorn) a watcher task waits for the disconnect message."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        reply = reply_of(scope)
        state = {"cut": False, "done": False}
        task = asyncio.current_task()
        assert task is not None

        def cut() -> None:
            if not reply.finished and not state["done"]:
                state["cut"] = True
                task.cancel()

        hooks: DisconnectHooks | None = (scope.get("extensions") or {}).get(DISCONNECT_EXTENSION)
        watcher: asyncio.Future[None] | None = None
        if hooks is not None:
            hooks.callbacks.append(cut)
        else:
            receive, watcher = _watched(receive, cut, state)
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if not state["cut"]:  # cancelled from outside (the server's own shutdown): pass it on
                raise
            if hasattr(task, "uncancel"):  # the client is gone: nothing to answer, and the task goes on clean
                task.uncancel()
        finally:
            state["done"] = True
            if hooks is not None:
                hooks.callbacks.remove(cut)
            if watcher is not None:
                watcher.cancel()


def _watched(receive: Receive, cut: Callable[[], None], state: dict[str, bool]) -> tuple[Receive, asyncio.Future[None]]:
    """The request's `receive`, and a task that waits for the disconnect once the body is read (the
    watch must not take a body chunk from the app) and then cuts the request."""
    body_read = asyncio.Event()

    async def receive_body() -> Message:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            body_read.set()
        return message

    async def watch() -> None:
        await body_read.wait()
        while not state["done"]:
            if (await receive())["type"] == "http.disconnect":
                cut()
                return

    return receive_body, asyncio.ensure_future(watch())
