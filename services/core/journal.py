"""Session journals and the replica registry, in a directory every replica of a server can read.

A stateful session is rebuilt on another replica by replaying its journal: the seed row,
then every tool call in order with the reply it got. The journal is written before the
reply leaves the replica, so a reply the agent saw is always in it; a reply lost with its
replica is in it too, which is why calls carry a sequence number (a repeated call is answered
from the journal instead of being applied twice).

Why files in a shared directory and not a peer's memory or a database: a journal must outlive
the process that wrote it (a peer's memory dies with the peer it was copied to, and copying
every call to a peer is a network hop per call); appending one line to a local file costs
microseconds, a directory is what Docker volumes and Kubernetes ReadWriteMany claims share
between replicas, and the launcher can delete it whole. A line is written with one `write`
of an `O_APPEND` file: a SIGKILLed writer leaves whole lines (a machine crash may lose the
last ones; the replay then diverges or finds the call missing and says so).

The same directory holds the replica registry (`replicas/<id>.json`: each live replica's
direct URL and open-session count, refreshed by its sweeper) and, for a session rebuilt
elsewhere, its current owner (`<session>.owner`).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

_SAFE_ID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,200}$")
STALE_REPLICA_S = 15.0  # a registry entry older than this is a replica that died


@dataclass
class JournalEntry:
    """One tool call as the session's owner answered it."""

    seq: int
    name: str
    arguments: dict[str, Any]
    status: int
    reply: Any


@dataclass
class Journal:
    row: dict[str, Any]
    calls: list[JournalEntry] = field(default_factory=list)
    nondeterministic: bool = False
    external_id: str | None = None  # the NeMo-Gym caller's resources_session_id, if it named the session


@dataclass
class Replica:
    id: str
    url: str
    sessions: int
    pid: int
    seen: float
    draining: bool = False  # stopping: serves the sessions it holds, takes no new ones

    @property
    def alive(self) -> bool:
        return time.time() - self.seen < STALE_REPLICA_S


def safe_id(value: str) -> bool:
    """Only ids that are plain file names (no separators, no leading dot) reach the file system."""
    return bool(_SAFE_ID.match(value)) and ".." not in value


class JournalStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        (self.root / "replicas").mkdir(parents=True, exist_ok=True)

    def _path(self, sid: str, suffix: str = ".jsonl") -> Path:
        if not safe_id(sid):
            raise ValueError(f"session id {sid!r} is not a journal name")
        return self.root / f"{sid}{suffix}"

    def _append(self, sid: str, record: dict[str, Any], *, create: bool = False) -> None:
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_TRUNC if create else 0)
        fd = os.open(self._path(sid), flags, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def start(self, sid: str, row: dict[str, Any], external_id: str | None = None) -> None:
        self._append(sid, {"row": row, "external_id": external_id}, create=True)

    def record(self, sid: str, entry: JournalEntry) -> None:
        with contextlib.suppress(FileNotFoundError):  # closed meanwhile
            self._append(sid, {"seq": entry.seq, "name": entry.name, "arguments": entry.arguments,
                               "status": entry.status, "reply": entry.reply})

    def mark_nondeterministic(self, sid: str) -> None:
        """The session did something a replay cannot repeat (the environment says which calls)."""
        with contextlib.suppress(FileNotFoundError):
            self._append(sid, {"nondeterministic": True})

    def read(self, sid: str) -> Journal | None:
        try:
            lines = self._path(sid).read_text().splitlines()
        except (FileNotFoundError, ValueError):
            return None
        if not lines:
            return None
        try:
            head = json.loads(lines[0])
        except ValueError:
            return None
        journal = Journal(row=head.get("row") or {}, external_id=head.get("external_id"))
        for line in lines[1:]:
            try:
                rec = json.loads(line)
            except ValueError:  # a torn last line: the call it describes never answered
                break
            if rec.get("nondeterministic"):
                journal.nondeterministic = True
                continue
            journal.calls.append(JournalEntry(int(rec["seq"]), str(rec["name"]), dict(rec["arguments"]),
                                              int(rec["status"]), rec.get("reply")))
        return journal

    def drop(self, sid: str) -> None:
        for suffix in (".jsonl", ".owner", ".lock"):
            with contextlib.suppress(FileNotFoundError, ValueError):
                self._path(sid, suffix).unlink()

    # ---- ownership after a rebuild -------------------------------------- #
    @contextlib.contextmanager
    def locked(self, sid: str) -> Iterator[None]:
        """One replica at a time decides who rebuilds a session (an exclusive lock on its lock file)."""
        fd = os.open(self._path(sid, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def owner(self, sid: str) -> str | None:
        """The replica id that rebuilt the session, if one did."""
        try:
            return self._path(sid, ".owner").read_text().strip() or None
        except (FileNotFoundError, ValueError):
            return None

    def set_owner(self, sid: str, replica_id: str) -> None:
        tmp = self._path(sid, ".owner.tmp")
        tmp.write_text(replica_id)
        tmp.replace(self._path(sid, ".owner"))

    # ---- the replica registry ------------------------------------------- #
    def register(self, replica: Replica) -> None:
        path = self.root / "replicas" / f"{replica.id}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"id": replica.id, "url": replica.url, "sessions": replica.sessions,
                                   "pid": replica.pid, "seen": replica.seen, "draining": replica.draining}))
        tmp.replace(path)

    def unregister(self, replica_id: str) -> None:
        if safe_id(replica_id):
            with contextlib.suppress(FileNotFoundError):
                (self.root / "replicas" / f"{replica_id}.json").unlink()

    def replicas(self) -> dict[str, Replica]:
        out = {}
        for path in (self.root / "replicas").glob("*.json"):
            try:
                data = json.loads(path.read_text())
                out[str(data["id"])] = Replica(str(data["id"]), str(data["url"]), int(data["sessions"]),
                                               int(data["pid"]), float(data["seen"]), bool(data.get("draining")))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return out
