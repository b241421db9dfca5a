"""`gymserve dashboard [--head URL] [--port P]`: the head's dashboard in a browser when the head wants a key.

A browser cannot add `Authorization: Bearer` to a page it opens, so with GYMSERVE_API_KEY set
the head answers `/dashboard` with 401. This command serves a read-only forwarder on a
loopback address of this machine that adds the key (from GYMSERVE_API_KEY or
GYMSERVE_API_KEY_FILE) to GET requests and passes them to the head. The key never reaches the
browser; anything else than GET/HEAD is refused, so the forwarder gives no write access.

Only the dashboard is forwarded (its page, data and static files, plus the probes), never the
config, the registry or the proxy; and only to requests whose Host header is a loopback name,
so a web page on another origin cannot read it through DNS rebinding. The path is resolved
before it is judged: it is read from the request as sent, each segment decoded once, and a
`.`/`..` segment, an encoded `/` or `\\`, or an empty segment is refused (`..%2f..%2fconfig`
would otherwise pass as a static file and leave the dashboard once the client normalised it);
a static file must be one of the dashboard's own, and the head gets the path rebuilt from the
resolved name.
"""
from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
from collections.abc import AsyncIterator
from urllib.parse import quote, unquote

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
STATIC_PREFIX = "/dashboard/static/"
# the dashboard's own files (gateway/dashboard.py's STATIC_FILES; this command does not import the head)
STATIC_FILES = frozenset({"dashboard.js", "dashboard.css", "uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE"})


def resolved_path(raw: str) -> str | None:
    """The path to forward for a request path as the client sent it (percent-encoded), or None when it
    is not the dashboard's: every segment decoded once and judged whole, never normalised into another."""
    if not raw.startswith("/"):
        return None
    segments = raw.split("/")[1:]
    decoded = [unquote(s) for s in segments]
    if any(d in (".", "..") or "/" in d or "\\" in d or "\x00" in d for d in decoded):
        return None
    path = "/" + "/".join(decoded)
    if path in FORWARDED_PATHS:
        return path
    if path.startswith(STATIC_PREFIX) and path[len(STATIC_PREFIX):] in STATIC_FILES:
        return STATIC_PREFIX + quote(path[len(STATIC_PREFIX):])
    return None


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
        raw = request.scope.get("raw_path") or request.url.path.encode()
        path = resolved_path(raw.decode("latin-1"))
        if path is None:
            return JSONResponse({"detail": f"{request.url.path}: the dashboard forwarder passes on the dashboard "
                                 "only"}, status_code=404)
        try:
            upstream = await client.request(request.method, path, params=request.query_params)
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
