"""Per-execution cgroups: a process cap and a memory cap that hold even when the server runs as root.

Why: RLIMIT_NPROC is counted per real user and the kernel never applies it to root; bubblewrap
started by root maps the sandbox's uid onto root outside. A pids cgroup caps the number of tasks
whatever the uid, and a memory cgroup caps the sandbox's TOTAL memory (RLIMIT_AS is per process,
so N processes could otherwise use N times the limit). Used where the cgroup file system is
writable (root on cgroup v1, or a v2 tree with the controllers enabled); otherwise the sandbox
falls back to rlimits (see sandbox.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import uuid
from pathlib import Path

log = logging.getLogger("gymserve.code")

_V1 = {"pids": Path("/sys/fs/cgroup/pids"), "memory": Path("/sys/fs/cgroup/memory")}
_V2 = Path("/sys/fs/cgroup")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _clear(parent: Path) -> None:
    for child in list(parent.iterdir()) if parent.is_dir() else []:
        if child.is_dir():
            _kill_all(child)
            with contextlib.suppress(OSError):
                child.rmdir()
    with contextlib.suppress(OSError):
        parent.rmdir()


def _kill_all(path: Path) -> None:
    with contextlib.suppress(OSError):
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)


class Cgroups:
    """Parent cgroups owned by this server (one per hierarchy); `child()` makes one set per execution."""

    def __init__(self, parents: dict[str, Path]) -> None:
        self.parents = parents  # controller -> parent dir (v2: the same dir for both)

    @property
    def memory(self) -> bool:
        return "memory" in self.parents

    @classmethod
    def create(cls) -> "Cgroups | None":
        """Set up what this machine allows; None when there is no usable pids controller."""
        name = f"gymserve-{os.getpid()}"
        parents: dict[str, Path] = {}
        if _V1["pids"].is_dir() and not (_V1["pids"] / "cgroup.controllers").exists():
            for controller, base in _V1.items():
                cls._sweep(base)
                with contextlib.suppress(OSError):
                    (base / name).mkdir(exist_ok=True)
                    if cls._works(base / name, controller):
                        parents[controller] = base / name
        elif (_V2 / "cgroup.controllers").exists():
            cls._sweep(_V2)
            with contextlib.suppress(OSError):
                available = (_V2 / "cgroup.controllers").read_text().split()
                (_V2 / name).mkdir(exist_ok=True)
                for controller in ("pids", "memory"):
                    if controller in available:
                        with contextlib.suppress(OSError):
                            (_V2 / "cgroup.subtree_control").write_text(f"+{controller}")
                        with contextlib.suppress(OSError):
                            (_V2 / name / "cgroup.subtree_control").write_text(f"+{controller}")
                        if cls._works(_V2 / name, controller):
                            parents[controller] = _V2 / name
        if "pids" not in parents:
            for parent in set(parents.values()) | {_V1["pids"] / name, _V1["memory"] / name, _V2 / name}:
                with contextlib.suppress(OSError):
                    parent.rmdir()
            return None
        return cls(parents)

    @staticmethod
    def _works(parent: Path, controller: str) -> bool:
        probe = parent / "probe"
        try:
            probe.mkdir(exist_ok=True)
            limit = "pids.max" if controller == "pids" else (
                "memory.max" if (probe / "memory.max").exists() else "memory.limit_in_bytes")
            (probe / limit).write_text("8" if controller == "pids" else str(64 << 20))
            return True
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()

    @staticmethod
    def _sweep(base: Path) -> None:
        """Remove parents left behind by servers that were killed without a clean shutdown."""
        for stale in base.glob("gymserve-*"):
            with contextlib.suppress(ValueError):
                if not _alive(int(stale.name.split("-", 1)[1])):
                    _clear(stale)

    def child(self, max_pids: int, memory_bytes: int) -> list[Path]:
        """Fresh cgroups for one execution (one per hierarchy), limits written."""
        leaf = uuid.uuid4().hex[:16]
        paths: list[Path] = []
        try:
            for parent in self.parents.values():
                path = parent / leaf
                if path not in paths:
                    path.mkdir()
                    paths.append(path)
            self.limit(paths, max_pids, memory_bytes)
            return paths
        except OSError:
            for path in paths:
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise

    def limit(self, paths: list[Path], max_pids: int, memory_bytes: int) -> None:
        """(Re)write the limits of one execution's cgroups (a pre-started sandbox gets its row's)."""
        for controller, parent in self.parents.items():
            path = next(p for p in paths if p.parent == parent)
            if controller == "pids":
                (path / "pids.max").write_text(str(max_pids))
            elif (path / "memory.max").exists():
                (path / "memory.max").write_text(str(memory_bytes))
                with contextlib.suppress(OSError):
                    (path / "memory.swap.max").write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(str(memory_bytes))

    @staticmethod
    def oom_killed(paths: list[Path]) -> bool:
        """Whether the kernel's OOM killer fired inside these cgroups (memory cap reached)."""
        return Cgroups.oom_kills(paths) > 0

    @staticmethod
    def oom_kills(paths: list[Path]) -> int:
        """How many times the kernel's OOM killer fired inside these cgroups."""
        kills = 0
        for path in paths:
            for name in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError, ValueError):
                    for line in (path / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            kills += int(value.strip() or 0)
        return kills

    @staticmethod
    def kill_all(paths: list[Path]) -> None:
        for path in paths:
            _kill_all(path)

    async def remove(self, paths: list[Path]) -> None:
        """Kill what is left and remove the cgroups (possible once every task is reaped)."""
        for path in paths:
            for attempt in range(50):
                _kill_all(path)
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    await asyncio.sleep(0.02 * (attempt + 1))
            else:
                log.warning("could not remove cgroup %s", path)

    async def close(self) -> None:
        """Remove every per-execution cgroup (waiting for their tasks to be reaped), then the parents."""
        for parent in set(self.parents.values()):
            children = [c for c in parent.iterdir() if c.is_dir()] if parent.is_dir() else []
            await self.remove(children)
            with contextlib.suppress(OSError):
                parent.rmdir()
