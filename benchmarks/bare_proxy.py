"""The least a proxy process can cost: `head_proxy.py`'s reference side, not a server to deploy.

Run (by `head_proxy.py`): `.venv/bin/python benchmarks/bare_proxy.py PORT UPSTREAM_PORT`

Requests are parsed by httptools in a bare asyncio protocol and forwarded through the head's own
upstream pool (`services.core.http_pool`); the reply goes back with its status, headers and body.
No ASGI server, no middleware (no auth, request ids, metrics, limits or error replies), no
pipelining, no streaming: what is left is the hop itself, so head vs this is what the head's
server and shared middleware cost, and this vs direct is what any extra process costs. It runs
under the head's scheduling policy (SCHED_BATCH, `cpu_policy`), so that is not the difference.
"""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httptools
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.core.http_pool import ConnectionPool, Origin  # noqa: E402
from services.core.serving import set_cpu_policy  # noqa: E402

_DROP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host", b"date",
                   b"server"})


class Front(asyncio.Protocol):
    def __init__(self, pool: ConnectionPool, origin: Origin) -> None:
        self.pool, self.origin = pool, origin
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", [], []  # type: ignore[var-annotated]

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.body)
        headers = [(k, v) for k, v in self.headers if k not in _DROP] + [(b"content-length", b"%d" % len(body))]
        target = b"/" + self.url.split(b"/", 3)[3]  # /servers/<name>/<rest> -> /<rest>
        asyncio.ensure_future(self.forward(self.parser.get_method().decode(), target, headers, body))

    async def forward(self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        reply = await self.pool.request(self.origin, method, target, headers, body)
        try:
            payload = await reply.read()
        finally:
            reply.release()
        head = [b"HTTP/1.1 %d -" % reply.status] + [k + b": " + v for k, v in reply.headers if k not in _DROP]
        head.append(b"content-length: %d" % len(payload))
        assert self.transport is not None
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + payload)


async def main(port: int, upstream_port: int) -> None:
    pool = ConnectionPool()
    origin = Origin("http", "127.0.0.1", upstream_port)
    server = await asyncio.get_running_loop().create_server(lambda: Front(pool, origin), "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    set_cpu_policy("batch")
    uvloop.run(main(int(sys.argv[1]), int(sys.argv[2])))
