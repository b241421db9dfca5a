"""`gymserve dashboard [--head URL] [--port P]`: the head's dashboard in a browser when the head wants a key.

A browser cannot add `Authorization: Bearer` to a page it opens, so with GYMSERVE_API_KEY set
the head answers `/dashboard` with 401. This command serves a read-only forwarder on a
loopback address of this machine that adds the key (from GYMSERVE_API_KEY or
GYMSERVE_API_KEY_FILE) to GET requests and passes them to the head. The key never reaches the
browser; anything else than GET/HEAD is refused, so the forwarder gives no write access.

Only the dashboard is forwarded (its page, data and static files, plus the probes), never the
config, the registry or the proxy; and only to requests whose Host header is a loopback name,
so a web page on another origin cannot read it through DNS rebinding.
"""
from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from services.core.auth import auth_headers
from services.core.config import DEFAULT_HEAD_PORT, ConfigError

DEFAULT_PORT = 11080
# reply headers that describe the upstream connection, not the content
_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "content-encoding"})
FORWARDED_PATHS = frozenset({"/", "/health", "/ready", "/dashboard", "/dashboard/data"})
FORWARDED_PREFIXES = ("/dashboard/static/",)


def loopback_name(host: str) -> bool:
    """True for a Host header naming this machine's loopback (`localhost`, 127.0.0.0/8, [::1]), any port."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") and host.count(":") == 1 else host
    name = name.strip().lower()
    if name.startswith("["):
        name = name[1:].split("]", 1)[0]
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--head", default=None, metavar="URL",
                        help=f"head URL (default: $GYMSERVE_HEAD_URL or http://127.0.0.1:{DEFAULT_HEAD_PORT})")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")


def build(head: str, headers: dict[str, str]) -> Starlette:
    """The forwarder: GET/HEAD of any path goes to `head` with `headers` (the bearer key) added."""
    client = httpx.AsyncClient(base_url=head, headers=headers, timeout=30.0, trust_env=False)

    async def forward(request: Request) -> Response:
        host = request.headers.get("host", "")
        if not loopback_name(host):
            return JSONResponse({"detail": f"Host {host!r}: the dashboard forwarder answers loopback names only"},
                                status_code=403)
        if request.method not in ("GET", "HEAD"):
            return JSONResponse({"detail": f"{request.method}: the dashboard forwarder is read-only (GET only)"},
                                status_code=405, headers={"allow": "GET, HEAD"})
        path = request.url.path
        if path not in FORWARDED_PATHS and not path.startswith(FORWARDED_PREFIXES):
            return JSONResponse({"detail": f"{path}: the dashboard forwarder passes on the dashboard only"},
                                status_code=404)
        try:
            upstream = await client.request(request.method, request.url.path, params=request.query_params)
        except httpx.HTTPError as exc:
            return JSONResponse({"detail": f"cannot reach the head at {head}: {type(exc).__name__}: {exc}"},
                                status_code=502)
        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
        return Response(upstream.content, status_code=upstream.status_code, headers=kept)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)], lifespan=lifespan)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    try:
        loopback = ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        loopback = args.host == "localhost"
    if not loopback:
        raise ConfigError(f"--host {args.host}: the forwarder adds your key to every request, so it listens "
                          "on a loopback address only (use an SSH tunnel to reach it from elsewhere)")
    headers = auth_headers()
    if not headers:
        print("gymserve dashboard: no GYMSERVE_API_KEY (or GYMSERVE_API_KEY_FILE) set: forwarding without a key")
    head = (args.head or os.environ.get("GYMSERVE_HEAD_URL") or f"http://127.0.0.1:{DEFAULT_HEAD_PORT}").rstrip("/")
    print(f"dashboard of {head}: open http://{args.host}:{args.port}/dashboard (Ctrl-C stops)", flush=True)
    uvicorn.run(build(head, headers), host=args.host, port=args.port, log_level="warning")
    return 0
