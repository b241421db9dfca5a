"""Self-registration with the head (`POST /register`), repeated as a heartbeat.

The first registration returns a lease that every heartbeat sends back: the name stays ours
until our heartbeat runs out. A server started by `gymserve up` also sends the stack token
(GYMSERVE_STACK_TOKEN), which lets it keep its stack entry current.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket

from .auth import trust
from .client import shared_client
from .config import ServerConfig
from .hosts import ANY_ADDRESSES

log = logging.getLogger("gymserve.registration")


def advertised_host(config: ServerConfig) -> str:
    """The host other servers should use: GYMSERVE_ADVERTISE_HOST (e.g. a compose service name),
    else the bind address, else this machine's hostname when bound to all interfaces."""
    host = os.environ.get("GYMSERVE_ADVERTISE_HOST") or config.host
    if host in ANY_ADDRESSES:
        host = socket.gethostname()
    return host


def registration_body(config: ServerConfig, server_type: str) -> dict:
    host = advertised_host(config)
    url = f"http://{host}:{config.port}"
    body: dict[str, object] = {
        "name": config.name,
        "server_type": server_type,
        "kind": config.kind,
        "host": host,
        "port": config.port,
        "url": url,
        "pid": os.getpid(),
        "ttl_s": max(3 * config.heartbeat_s, 5.0),
    }
    if server_type == "resources_servers":  # every resource server speaks OpenEnv and MCP too
        from .bindings import binding_urls

        body.update(binding_urls(url))
    return body


STACK_TOKEN_ENV = "GYMSERVE_STACK_TOKEN"
STACK_TOKEN_HEADER = "X-Gymserve-Stack-Token"


def stack_headers() -> dict[str, str]:
    token = os.environ.get(STACK_TOKEN_ENV)
    return {STACK_TOKEN_HEADER: token} if token else {}


async def register(head_url: str, body: dict) -> dict:
    """One `POST /register` (the body's `lease` is updated from the reply); raises when the head cannot
    be reached (it may start after us) or refuses."""
    trust(head_url)
    reply = await shared_client().post_json(f"{head_url.rstrip('/')}/register", body, deadline_s=5.0, retries=0,
                                            headers=stack_headers())
    if isinstance(reply, dict) and isinstance(reply.get("lease"), str):
        body["lease"] = reply["lease"]
    return reply if isinstance(reply, dict) else {}


async def unregister(head_url: str, body: dict) -> None:
    """`POST /unregister` with our lease, so a successor under the same name need not wait for our TTL."""
    await shared_client().post_json(f"{head_url.rstrip('/')}/unregister",
                                    {"name": body["name"], "lease": body.get("lease")}, deadline_s=2.0, retries=0,
                                    headers=stack_headers())


async def heartbeat_loop(config: ServerConfig, server_type: str) -> None:
    """Register now and every `heartbeat_s`; a head that is down is retried quietly. Cancelled (the
    server stops): unregister."""
    if not config.head_url:
        return
    body = registration_body(config, server_type)
    warned = False
    try:
        while True:
            try:
                await register(config.head_url, body)
                warned = False
            except Exception as exc:  # the head may start after us or restart
                if not warned:
                    log.warning("cannot register with head at %s: %s", config.head_url, exc)
                    warned = True
            await asyncio.sleep(config.heartbeat_s)
    except asyncio.CancelledError:
        if body.get("lease"):
            try:
                await unregister(config.head_url, body)
            except Exception:  # the head may be gone already
                pass
        raise
