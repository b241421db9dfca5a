"""Other protocols' faces of a resource server: OpenEnv (`/openenv`) and MCP (`/mcp`).

Each binding drives the environment's own session store, tools and `/verify` path in-process, so it
shares the server's auth, limits, metrics and failure masking instead of re-implementing them.
"""
from __future__ import annotations

from fastapi import FastAPI

from ..resource import Environment
from .episode import Count
from .mcp import PATH as MCP_PATH
from .mcp import mount_mcp
from .openenv import PREFIX as OPENENV_PREFIX
from .openenv import build_openenv_app

__all__ = ["MCP_PATH", "OPENENV_PREFIX", "binding_urls", "mount_bindings"]


def mount_bindings(app: FastAPI, env: Environment, count: Count) -> None:
    mount_mcp(app, env)
    app.mount(OPENENV_PREFIX, build_openenv_app(env, count))


def binding_urls(url: str) -> dict[str, str]:
    """`openenv_url` and `mcp_url` of the resource server at `url`."""
    base = url.rstrip("/")
    return {"openenv_url": base + OPENENV_PREFIX, "mcp_url": base + MCP_PATH}
