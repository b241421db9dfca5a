"""A request whose client has gone away is cancelled instead of worked to the end.

Nobody reads its reply: a rollout the trainer cut at its batch deadline would otherwise keep the agent,
the model and the resource server busy, and a server being stopped would wait out its graceful-shutdown
time for it. The cancellation travels down the chain: the agent's own calls close their connections, so
the servers behind it notice the same way.

The client is watched only once the handler has read the whole body (the watch must not take a body
chunk from it), and a reply already sent is never cancelled.
"""
from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .reply import reply_of


class DisconnectMiddleware:
    """Outside every layer but the reply's record: runs the request in the server's own task and cancels
    that task when the client disconnects. A watcher task waits for the disconnect; the request itself
    is not moved to a task of its own (one task fewer per request, in every server)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_read = asyncio.Event()
        reply = reply_of(scope)
        state = {"cut": False, "done": False}
        task = asyncio.current_task()
        assert task is not None

        async def receive_body() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read.set()
            return message

        async def watch() -> None:
            await body_read.wait()
            while not state["done"]:
                if (await receive())["type"] == "http.disconnect":
                    if not reply.finished and not state["done"]:
                        state["cut"] = True
                        task.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            await self.app(scope, receive_body, send)
        except asyncio.CancelledError:
            if not state["cut"]:  # cancelled from outside (the server's own shutdown): pass it on
                raise
            if hasattr(task, "uncancel"):  # the client is gone: nothing to answer, and the task goes on clean
                task.uncancel()
        finally:
            state["done"] = True
            watcher.cancel()
