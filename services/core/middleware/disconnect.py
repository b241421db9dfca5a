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


class DisconnectMiddleware:
    """Outermost layer: runs the request as a task and cancels it when the client disconnects."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_read = asyncio.Event()
        replied = False
        cut = False

        async def receive_body() -> Message:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                body_read.set()
            return message

        async def send_marked(message: Message) -> None:
            nonlocal replied
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                replied = True
            await send(message)

        handler = asyncio.ensure_future(self.app(scope, receive_body, send_marked))

        async def watch() -> None:
            nonlocal cut
            await body_read.wait()
            while not handler.done():
                if (await receive())["type"] == "http.disconnect":
                    if not replied and not handler.done():
                        cut = True
                        handler.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            await handler
        except asyncio.CancelledError:
            if not cut:  # cancelled from outside (the server's own shutdown): pass it on
                raise
            # the client is gone: nothing to answer
        finally:
            watcher.cancel()
