"""terminal: a multi-step shell task in a sandboxed workspace, judged by the task's check script.

A row states a goal (the prompt), the files the workspace starts with (`files`, optional) and a
`check`: a bash script run in the workspace at `/verify`; exit code 0 is reward 1. With a live
session the check runs in the session's own workspace; without one (offline re-scoring) the
trajectory's `bash`/`write_file`/`apply_patch` calls are replayed in a fresh workspace first.
A sandbox failure is a masked reply (`failure_kind: sandbox`), never a 0.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from pydantic import Field

from services.core.content import function_calls
from services.core.errors import BadRequest, GymError
from services.core.replies import exception_reply, scored_reply
from services.core.resource import Session, create_resource_app
from services.core.sandbox.environment import TOOL_SPECS, WorkspaceConfig, WorkspaceEnvironment, as_sandbox_failure
from services.core.sandbox.workspace import Workspace, WorkspaceError
from services.core.schemas import VerifyReply, VerifyRequest

REPLAYED = ("bash", "write_file", "apply_patch")
MAX_FILES = 256


class Config(WorkspaceConfig):
    check_timeout_s: float = Field(60.0, gt=0, le=3600, description="wall-clock limit of the check script")


class TerminalRequest(VerifyRequest):
    check: str = Field(description="bash script run in /workspace at verify; exit code 0 means solved")
    files: dict[str, str] | None = Field(None, description="files the workspace starts with (path -> text)")
    image: str | None = Field(None, description="docker provider: the task's image")


class TerminalReply(VerifyReply):
    check_exit_code: int | None = None
    check_output: str | None = None
    state_source: str | None = None


def _files(body: dict[str, Any]) -> dict[str, str]:
    files = body.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise BadRequest("files: expected an object mapping relative paths to text")
    if len(files) > MAX_FILES:
        raise BadRequest(f"files: more than {MAX_FILES} files")
    seen: dict[tuple[str, ...], str] = {}
    for path in files:
        parts = Path(path).parts
        if not path or path.startswith("/") or path.endswith("/") or not parts or ".." in parts or "\x00" in path:
            raise BadRequest(f"files: {path!r} is not a relative path of a file inside the workspace")
        if parts in seen:
            raise BadRequest(f"files: {path!r} and {seen[parts]!r} are the same file")
        seen[parts] = path
    for parts, path in seen.items():  # a file where another one needs a folder
        for i in range(1, len(parts)):
            if parts[:i] in seen:
                raise BadRequest(f"files: {seen[parts[:i]]!r} is a file, but {path!r} needs it to be a folder")
    return files


def replayed_calls(request: VerifyRequest) -> list[tuple[str, dict[str, Any]]]:
    return function_calls(request.response.output, REPLAYED)


class Terminal(WorkspaceEnvironment):
    config_model = Config
    config: Config
    request_model = TerminalRequest
    reply_model = TerminalReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "Create hello.txt saying hi."}],
                                               "tools": TOOL_SPECS},
                   "check": "grep -qx hi hello.txt"}
    example_answer = "Done."
    description = "Shell tasks in a sandboxed workspace; reward 1 when the task's check script exits 0."

    def source(self, body: dict[str, Any]) -> tuple[str | None, Path | None]:
        _files(body)
        return super().source(body)

    async def fresh(self, body: dict[str, Any], *, pooled: bool = True) -> Workspace:
        files = _files(body)
        if not files:
            return await super().fresh(body, pooled=pooled)
        # the task's files go in before the base snapshot, so the diff shows only the agent's work
        image, _ = self.source(body)
        with tempfile.TemporaryDirectory(prefix="gymserve-task-") as tmp:
            for rel, text in files.items():
                target = Path(tmp, rel)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text, encoding="utf-8")
            return await self.create_workspace(image, Path(tmp), pooled=False)

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        row = request.model_dump()
        check = row.get("check")
        if not isinstance(check, str) or not check.strip():
            raise BadRequest("check: expected a non-empty bash script")
        live = session.data.get("workspace") if session else None
        try:
            if live is not None:
                return await self._judge(request, live, check, "session")
            ws = await self.fresh(row, pooled=False)
            try:
                for name, args in replayed_calls(request):
                    try:
                        await getattr(self, name)(_Holder(ws), **args)
                    except (BadRequest, TypeError):
                        continue  # an invalid call of the model changed nothing
                return await self._judge(request, ws, check, "replay")
            finally:
                await ws.destroy()
        except BadRequest:
            raise
        except (WorkspaceError, GymError) as exc:
            return exception_reply(request, as_sandbox_failure(exc), model=TerminalReply)

    async def _judge(self, request: VerifyRequest, ws: Workspace, check: str, source: str) -> VerifyReply:
        result = await ws.exec(check, timeout_s=self.config.check_timeout_s)
        output = (result.stdout + result.stderr)[-2000:]
        return scored_reply(request, 1.0 if result.exit_code == 0 else 0.0, check_exit_code=result.exit_code,
                            check_output=output, state_source=source)


class _Holder(Session):
    """A stand-in session around a workspace, to replay tool calls through the same tool code."""

    def __init__(self, ws: Workspace) -> None:
        super().__init__("replay", {"workspace": ws})


def build(config: Config) -> FastAPI:
    return create_resource_app(Terminal(config))
