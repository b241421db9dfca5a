"""Who made a container or folder: `host:pid:start-time`, so a janitor can tell a dead server's leftovers
from a live one's (a pid alone can be reused; its start time in /proc cannot repeat)."""
from __future__ import annotations

import os
import socket


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def me() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def is_dead(owner: str) -> bool:
    """True when `owner` names a process of this host that no longer runs (never for other hosts)."""
    host, _, rest = owner.partition(":")
    pid, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    now = _start_time(int(pid))
    if started == "None":  # the owner could not read its start time: only a vanished pid is dead
        return now is None
    return now != started
