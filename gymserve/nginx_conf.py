"""An nginx front door for a stack: `/servers/<name>/...` routed straight to each server the head lists.

    python -m gymserve.nginx_conf --head http://127.0.0.1:11000 --listen 127.0.0.1:8080 \
        > /etc/nginx/conf.d/gymserve.conf && nginx -s reload

The head's own proxy (`/servers/<name>/...`) is a Python process; for a front door that costs less
CPU per request, nginx can route the same paths itself. This renders what goes inside nginx's `http`
block (a `conf.d/` file) from the head's `GET /server_instances`: one upstream (keep-alive) and one
`location` per server, requests and replies streamed unbuffered (SSE passes as it is written),
`X-Forwarded-Prefix` set as the head sets it, and any other path a JSON 404. nginx does not add the
bearer key: clients send their own, and every server checks it. Re-render and `nginx -s reload` when servers come and go.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any
from urllib.parse import urlsplit

import httpx

from services.core.auth import auth_headers

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")  # what the head's registry accepts; nothing nginx would parse


def render(instances: list[dict[str, Any]], *, listen: str = "127.0.0.1:8080", max_body_mb: int = 32,
           read_timeout_s: int = 600) -> str:
    """The upstreams and the server for these `GET /server_instances` rows, for inside nginx's `http`
    block (a row whose name or URL does not fit is left out, with a comment saying so)."""
    upstreams, locations, skipped = [], [], []
    for row in sorted(instances, key=lambda r: str(r.get("name"))):
        name, url = str(row.get("name", "")), str(row.get("url", ""))
        parts = urlsplit(url)
        if not _NAME.match(name) or parts.scheme not in ("http", "https") or not parts.hostname \
                or any(c in url for c in " ;{}'\"\\$#"):
            skipped.append(name)
            continue
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        port = parts.port or (443 if parts.scheme == "https" else 80)
        prefix = parts.path.rstrip("/")
        upstreams.append(f"upstream gymserve_{name} {{\n    server {host}:{port};\n    keepalive 32;\n}}")
        tls = "\n        proxy_ssl_server_name on;" if parts.scheme == "https" else ""
        # proxy_set_header in a location replaces every inherited one: all of them are here
        locations.append(
            f"    location /servers/{name}/ {{\n"
            f"        proxy_pass {parts.scheme}://gymserve_{name}{prefix}/;\n"
            f"        proxy_set_header Host $proxy_host;\n"
            f"        proxy_set_header Connection \"\";\n"
            f"        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n"
            f"        proxy_set_header X-Forwarded-Prefix /servers/{name};{tls}\n"
            f"    }}")
    note = f"# left out (name or URL nginx cannot take as it is): {', '.join(skipped)}\n" if skipped else ""
    return f"""# gymserve front door: rendered by `python -m gymserve.nginx_conf` from GET /server_instances
{note}{chr(10).join(upstreams)}
server {{
    listen {listen};
    client_max_body_size {max_body_mb}m;
    proxy_http_version 1.1;
    proxy_buffering off;
    proxy_request_buffering off;
    proxy_read_timeout {read_timeout_s}s;
    proxy_send_timeout {read_timeout_s}s;
    default_type application/json;
{chr(10).join(locations)}
    location / {{
        return 404 '{{"detail": "expected /servers/<name>/<path>: a server of the stack (GET /server_instances)"}}';
    }}
}}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head", default=os.environ.get("GYMSERVE_HEAD_URL") or "http://127.0.0.1:11000")
    parser.add_argument("--listen", default="127.0.0.1:8080", help="nginx's listen address (default 127.0.0.1:8080)")
    parser.add_argument("--max-body-mb", type=int, default=32, help="client_max_body_size (the servers' default)")
    args = parser.parse_args(argv)
    reply = httpx.get(f"{args.head.rstrip('/')}/server_instances", headers=auth_headers(), timeout=30)
    if reply.status_code != 200:
        print(f"GET {args.head}/server_instances: {reply.status_code} {reply.text[:300]}", file=sys.stderr)
        return 1
    sys.stdout.write(render(reply.json(), listen=args.listen, max_body_mb=args.max_body_mb))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
