"""The request path as the app's routes see it."""
from __future__ import annotations

from starlette.types import Scope


def route_path(scope: Scope) -> str:
    """The path below the app's mount point: behind a route prefix (Ray Serve mounts each
    server at `/<name>`) `scope["path"]` still starts with `root_path`."""
    path, root = scope["path"], scope.get("root_path", "")
    return (path[len(root):] or "/") if root and path.startswith(root) else path
