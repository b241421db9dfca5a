"""Self-registration with the head (`POST /register`), repeated as a heartbeat."""
from __future__ import annotations

import asyncio
import logging
import os
import socket

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
    return {
        "name": config.name,
        "server_type": server_type,
        "kind": config.kind,
        "host": host,
        "port": config.port,
        "url": f"http://{host}:{config.port}",
        "pid": os.getpid(),
        "ttl_s": max(3 * config.heartbeat_s, 5.0),
    }


async def register(head_url: str, body: dict) -> None:
    """One `POST /register`; raises when the head cannot be reached (it may start after us)."""
    await shared_client().post_json(f"{head_url.rstrip('/')}/register", body, deadline_s=5.0, retries=0)


async def heartbeat_loop(config: ServerConfig, server_type: str) -> None:
    """Register now and every `heartbeat_s`; a head that is down is retried quietly."""
    if not config.head_url:
        return
    body = registration_body(config, server_type)
    warned = False
    while True:
        try:
            await register(config.head_url, body)
            warned = False
        except Exception as exc:  # the head may start after us or restart
            if not warned:
                log.warning("cannot register with head at %s: %s", config.head_url, exc)
                warned = True
        await asyncio.sleep(config.heartbeat_s)
