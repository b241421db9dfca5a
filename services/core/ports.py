"""Free ports for servers we start ourselves (`gymserve up`, `gymserve serve` without `--port`, tests).

A port the kernel picks for `bind(0)` comes from its ephemeral range, the same range it draws from for
every outgoing connection: between picking the port and the server binding it, a client socket (a
readiness probe, a registration) can take it, and the server fails with "address already in use". So
ports come from below that range where there is room (never handed out by the kernel on its own), and a
process never hands out the same port twice.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 20000  # above Ray's worker ports (10002-19999) and the head's 11000
_handed_out: set[int] = set()
_random = random.Random()


def _quiet_ports() -> range | None:
    """Ports outside the kernel's ephemeral range, or None where it cannot be read or leaves too few."""
    try:
        low, high = map(int, _EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        return None
    if low - _LOWEST >= 1000:
        return range(_LOWEST, low)
    if 65535 - high >= 1000:
        return range(high + 1, 65536)
    return None


def port_free(host: str, port: int) -> bool:
    """Whether a server could bind `port` on `host` now (with SO_REUSEADDR, as servers bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to on `host` now, not handed out before by this process."""
    ports = _quiet_ports()
    for port in (_random.choice(ports) for _ in range(1000)) if ports else ():
        if port not in _handed_out and port_free(host, port):
            _handed_out.add(port)
            return port
    while True:  # no quiet range here: the kernel's pick
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            picked: int = sock.getsockname()[1]
        if picked not in _handed_out:
            _handed_out.add(picked)
            return picked
