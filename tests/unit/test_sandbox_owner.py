"""Owner markers: the janitor removes only what a dead server of this host left."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

from services.core.sandbox import owner


def test_live_dead_reused_and_foreign_owners() -> None:
    assert not owner.is_dead(owner.me())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    host = socket.gethostname()
    assert owner.is_dead(f"{host}:{child.pid}:123")  # gone
    mine = owner.me().rsplit(":", 1)[0]
    assert owner.is_dead(f"{mine}:1")  # same pid, another start time: the pid was reused
    assert not owner.is_dead(f"{host}:{os.getpid()}:None")  # no start time recorded: alive while the pid is
    assert not owner.is_dead(f"another-host:{child.pid}:1")  # never another host's
    assert not owner.is_dead("garbage")
