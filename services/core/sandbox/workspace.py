"""A workspace: a directory tree a session's commands run in, isolated by a provider.

Every provider implements `Provider.create` and `Workspace.exec`/`destroy`; file access,
snapshots and diffs are built on `exec` here, once, so both providers behave the same. A
workspace is a git work tree from its creation on: `diff()` is what changed since then.
"""
from __future__ import annotations

import abc
import dataclasses
import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

OWNER_LABEL = "gymserve.sandbox.owner"  # docker label / marker file naming the server that made it
WORKDIR = "/workspace"
# git's identity, no system or global config, and every setting through which a repository's own
# config or attributes could run a program or rewrite what a diff shows overridden on the command
# line (which wins over .git/config): the same in every workspace, whatever the policy wrote there
GIT = ("GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_ATTR_NOSYSTEM=1 GIT_TERMINAL_PROMPT=0 "
       "git -c user.name=gymserve -c user.email=gymserve@localhost -c core.hooksPath=/dev/null "
       "-c core.fileMode=false -c core.fsmonitor=false -c core.attributesFile=/dev/null "
       "-c core.pager=cat -c core.quotePath=true -c diff.noprefix=false -c diff.mnemonicPrefix=false "
       "-c diff.renames=false -c diff.relative=false -c core.autocrlf=false -c core.safecrlf=false")
_GIT = GIT


# written to stderr by each provider's wrapper just before it starts the command (and stripped again):
# a result without it is a sandbox that failed to start, one with it is the command's own doing,
# whatever the command prints or exits with (it cannot write before the mark)
STARTED = "[gymserve: command started]\n"


def started(result: ExecResult) -> bool:
    """Whether the sandbox got as far as the command (the mark is stripped). A result cut short (timed
    out, output over the cap) counts as started: the mark may not have been read before the kill."""
    if result.stderr.startswith(STARTED):
        result.stderr = result.stderr[len(STARTED):]
        return True
    return result.timed_out or result.output_exceeded


class WorkspaceError(Exception):
    """The sandbox itself failed (not the command): an infrastructure failure, masked as `sandbox`."""


class Limits(BaseModel):
    """Per-command and per-workspace limits (both providers enforce each)."""

    wall_s: float = Field(30.0, gt=0, le=3600, description="wall-clock limit of one command")
    cpu_s: int = Field(30, gt=0, le=3600, description="CPU seconds of one command")
    memory_mb: int = Field(1024, ge=64, description="memory of one command (docker: the container)")
    pids: int = Field(128, ge=8, description="processes at once")
    disk_mb: int = Field(256, ge=1, description="bytes the workspace may hold")
    file_mb: int = Field(64, ge=1, description="largest file a command may write")
    output_bytes: int = Field(65536, ge=1024, description="stdout/stderr kept per command (the rest is cut)")
    files: int = Field(100_000, ge=16, description="files and folders the workspace may hold")
    depth: int = Field(256, ge=8, description="how deep its folders may nest")


@dataclasses.dataclass
class ExecResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None: killed (timed out or over the output limit)
    timed_out: bool = False
    output_exceeded: bool = False

    def as_tool_reply(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class Workspace(abc.ABC):
    """One started sandbox with a writable `/workspace`."""

    def __init__(self, wid: str, limits: Limits) -> None:
        self.id = wid
        self.limits = limits
        self.base: str | None = None  # the git commit of the workspace as created

    @abc.abstractmethod
    async def exec(self, command: str, *, stdin: bytes = b"", timeout_s: float | None = None) -> ExecResult:
        """Run `bash -c command` in `/workspace` as the sandbox user; never raises for what the command does."""

    @abc.abstractmethod
    async def destroy(self) -> None:
        """Remove every process and file of the workspace (idempotent)."""

    async def must(self, command: str, *, stdin: bytes = b"", what: str = "") -> str:
        """`exec` that must succeed (set-up steps): a failure is a WorkspaceError."""
        result = await self.exec(command, stdin=stdin)
        if result.exit_code != 0:
            raise WorkspaceError(f"{what or command}: exit {result.exit_code}: {(result.stderr or result.stdout)[-400:]}")
        return result.stdout

    async def read_file(self, path: str) -> ExecResult:
        return await self.exec(f"cat -- {shlex.quote(path)}")

    async def write_file(self, path: str, content: str) -> ExecResult:
        quoted = shlex.quote(path)
        return await self.exec(f'mkdir -p -- "$(dirname -- {quoted})" && cat > {quoted}', stdin=content.encode())

    async def apply_patch(self, patch: str, *, exclude: list[str] | None = None) -> ExecResult:
        """`git apply` a unified diff (paths relative to /workspace); `exclude` globs are left out."""
        flags = " ".join(f"--exclude={shlex.quote(g)}" for g in exclude or [])
        return await self.exec(f"{_GIT} apply --whitespace=nowarn --recount {flags} -", stdin=patch.encode())

    async def snapshot(self) -> str:
        """Commit the current tree; returns the commit id (a later `diff(since=...)` compares with it)."""
        out = await self.must(f"{_GIT} add -A . && {_GIT} commit -q --allow-empty --no-verify -m snapshot "
                              f"&& {_GIT} rev-parse HEAD", what="snapshot")
        return out.strip().splitlines()[-1]

    async def diff(self, since: str | None = None) -> str:
        """Unified diff (binary-safe) of the tree against `since` (default: as created)."""
        result = await self.diff_result(since)
        if result.exit_code != 0:
            raise WorkspaceError(f"diff: exit {result.exit_code}: {(result.stderr or result.stdout)[-400:]}")
        return result.stdout

    async def diff_result(self, since: str | None = None) -> ExecResult:
        """`diff` as a command's result: in a workspace the policy used, git failing there (a removed or
        corrupted .git, a diff over the output cap) is the policy's doing, for the caller to score."""
        ref = since or self.base
        if ref is None:
            raise WorkspaceError("the workspace has no base snapshot")
        return await self.exec(f"{_GIT} add -A . >/dev/null && {_GIT} diff --cached --binary --no-ext-diff "
                               f"--no-textconv --no-color --no-renames {shlex.quote(ref)}")

    async def init_base(self) -> None:
        """Make the tree a git repository (if it is none) and remember its state as the base."""
        # byte-code caches are never part of a change
        await self.must(f"{{ [ -d .git ] || {_GIT} init -q . ; }} && mkdir -p .git/info "
                        "&& printf '__pycache__/\\n*.pyc\\n' >> .git/info/exclude", what="git init")
        self.base = await self.snapshot()


class Provider(abc.ABC):
    """Creates workspaces; `start()` probes that its isolation really holds and reclaims leftovers."""

    name: str = ""

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def create(self, *, image: str | None, folder: Path | None, limits: Limits) -> Workspace:
        """A started workspace holding a copy of `folder` (or the image's `/workspace`), with a base snapshot."""

    async def close(self) -> None:  # noqa: B027 - optional hook, most providers run nothing of their own
        """Stop what the provider itself runs (workspaces are destroyed by their owners)."""

    def describe(self) -> dict[str, Any]:
        return {"provider": self.name}
