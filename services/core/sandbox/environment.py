"""The shared base of environments whose sessions own a sandboxed workspace (terminal, swe).

Config picks the provider (`bwrap` by default, `docker` for clusters), the limits and the warm
pool. Tools `bash`, `read_file`, `write_file` and `apply_patch` act on the session's workspace;
a sandbox that fails is a 503 with `kind: sandbox` (the agent masks the rollout), never a tool
error the model is blamed for.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from ..errors import BadRequest, TooManyRequests, Unavailable
from ..failures import FailureKind
from ..resource import Environment, ResourceConfig, Session, tool
from .folder import BwrapProvider
from .docker import DockerProvider
from .pool import WorkspacePool
from .workspace import Limits, Provider, Workspace, WorkspaceError

log = logging.getLogger("gymserve.sandbox")
MAX_TOOL_TEXT = 1 << 20


class WorkspaceConfig(ResourceConfig):
    use_pool: bool = False  # the work runs in sandboxes, not in worker processes
    sandbox_provider: Literal["bwrap", "docker"] = Field("bwrap", description="bwrap (default, no docker) or docker")
    sandbox_image: str | None = Field(None, description="docker: image of rows that name none")
    warm_pool: int = Field(2, ge=0, le=64, description="started workspaces kept ready per task source")
    pool_idle_s: float = Field(600.0, gt=0, description="a task source unused this long stops being pre-started")
    pool_max_age_s: float = Field(3600.0, gt=0, description="a pre-started workspace older than this is replaced")
    max_sessions: int = Field(64, gt=0, description="workspaces alive at once; a /seed_session beyond gets 429")
    limits: Limits = Field(default_factory=Limits, description="per-command and per-workspace limits")


class WorkspaceEnvironment(Environment):
    config_model = WorkspaceConfig
    config: WorkspaceConfig

    def __init__(self, config: WorkspaceConfig) -> None:
        super().__init__(config)
        self.provider: Provider = (DockerProvider(default_image=config.sandbox_image)
                                   if config.sandbox_provider == "docker" else BwrapProvider())
        self.pool = None
        self.workspaces = WorkspacePool(self.provider, config.limits, size=config.warm_pool,
                                        idle_s=config.pool_idle_s, max_age_s=config.pool_max_age_s)
        self.open_workspaces = 0
        self.expiry: asyncio.Task[None] | None = None
        self.started = False

    async def startup(self) -> None:
        await super().startup()
        try:
            await self.provider.start()
        except WorkspaceError as exc:
            raise RuntimeError(f"{self.config.name}: sandbox provider {self.provider.name} unusable: {exc}") from None
        self.expiry = asyncio.create_task(self.workspaces.run_expiry())
        self.started = True

    async def shutdown(self) -> None:
        await super().shutdown()
        if self.expiry:
            self.expiry.cancel()
            with contextlib.suppress(BaseException):
                await self.expiry
        await self.workspaces.close()
        await self.provider.close()

    def ready(self) -> bool:
        return self.started

    def ready_details(self) -> dict[str, Any]:
        return {"sandbox": self.provider.describe()}

    # ---- workspaces -------------------------------------------------------- #
    def source(self, body: dict[str, Any]) -> tuple[str | None, Path | None]:
        """(image, folder) a row's workspace starts from; environments override."""
        return body.get("image") or None, None

    async def fresh(self, body: dict[str, Any], *, pooled: bool = True) -> Workspace:
        """A started workspace for a row (`pooled=False`: never a pre-started one, e.g. for grading)."""
        image, folder = self.source(body)
        return await self.create_workspace(image, folder, pooled=pooled)

    async def create_workspace(self, image: str | None, folder: Path | None, *, pooled: bool) -> Workspace:
        if self.config.sandbox_provider == "bwrap":
            image = None  # per-row images are for the docker provider; bwrap runs on the host's /usr
        try:
            if pooled:
                return await self.workspaces.take(image=image, folder=folder)
            return await self.provider.create(image=image, folder=folder, limits=self.config.limits)
        except WorkspaceError as exc:
            raise Unavailable(f"sandbox: {exc}", kind=FailureKind.SANDBOX) from None

    async def seed(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        self.source(body)  # validates the row before anything starts
        if self.open_workspaces >= self.config.max_sessions:
            raise TooManyRequests(f"too many open sessions (max_sessions={self.config.max_sessions}); close some or retry")
        self.open_workspaces += 1
        try:
            session.data["workspace"] = await self.fresh(body)
        except BaseException:
            self.open_workspaces -= 1
            raise
        return {"sandbox": self.provider.name, "tools": ["bash", "read_file", "write_file", "apply_patch"]}

    async def release(self, session: Session) -> None:
        ws = session.data.pop("workspace", None)
        if ws is not None:
            self.open_workspaces -= 1
            await ws.destroy()

    def workspace(self, session: Session) -> Workspace:
        ws = session.data.get("workspace")
        if ws is None:
            raise BadRequest("this session has no workspace: seed it with the row first")
        return ws

    async def run_tool(self, session: Session, coro_fn: Any, *args: Any) -> dict[str, Any]:
        try:  # the server already serializes a session's tool calls (its lock is held here)
            result = await coro_fn(*args)
        except WorkspaceError as exc:
            log.error("sandbox failure in a tool: %s", exc)
            raise Unavailable(f"sandbox: {exc}", kind=FailureKind.SANDBOX) from None
        return result.as_tool_reply()

    # ---- tools ------------------------------------------------------------ #
    @tool
    async def bash(self, session: Session, command: Any = None) -> dict[str, Any]:
        """Run a bash command in /workspace; returns stdout, stderr and exit_code."""
        ws = self.workspace(session)
        return await self.run_tool(session, ws.exec, _text(command, "command"))

    @tool
    async def read_file(self, session: Session, path: Any = None) -> dict[str, Any]:
        """Print a file of the workspace (paths relative to /workspace)."""
        ws = self.workspace(session)
        return await self.run_tool(session, ws.read_file, _text(path, "path"))

    @tool
    async def write_file(self, session: Session, path: Any = None, content: Any = None) -> dict[str, Any]:
        """Create or replace a file of the workspace."""
        ws = self.workspace(session)
        return await self.run_tool(session, ws.write_file, _text(path, "path"), _text(content, "content", empty=True))

    @tool
    async def apply_patch(self, session: Session, patch: Any = None) -> dict[str, Any]:
        """Apply a unified diff (git format, paths relative to /workspace)."""
        ws = self.workspace(session)
        return await self.run_tool(session, ws.apply_patch, _text(patch, "patch"))

    def tool_parameters(self, name: str, fn: Any) -> dict[str, Any]:
        fields = {"bash": ["command"], "read_file": ["path"], "write_file": ["path", "content"], "apply_patch": ["patch"]}
        if name in fields:
            return {"type": "object", "properties": {f: {"type": "string"} for f in fields[name]},
                    "required": fields[name], "additionalProperties": False}
        return super().tool_parameters(name, fn)


def as_sandbox_failure(exc: BaseException) -> BaseException:
    """A workspace failure as the error a masked `sandbox` reply is built from."""
    if isinstance(exc, WorkspaceError):
        return Unavailable(f"sandbox: {exc}", kind=FailureKind.SANDBOX)
    return exc


def _text(value: Any, field: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty):
        raise BadRequest(f"{field}: expected a {'string' if empty else 'non-empty string'}")
    if len(value) > MAX_TOOL_TEXT:
        raise BadRequest(f"{field}: longer than {MAX_TOOL_TEXT} characters")
    if "\x00" in value:
        raise BadRequest(f"{field}: contains a NUL character")
    return value


TOOL_SPECS = [
    {"type": "function", "name": "bash", "description": "Run a bash command in /workspace.",
     "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"type": "function", "name": "read_file", "description": "Read a file of /workspace.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"type": "function", "name": "write_file", "description": "Create or replace a file of /workspace.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                    "required": ["path", "content"]}},
    {"type": "function", "name": "apply_patch", "description": "Apply a unified diff to /workspace.",
     "parameters": {"type": "object", "properties": {"patch": {"type": "string"}}, "required": ["patch"]}},
]
