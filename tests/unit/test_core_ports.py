"""Ports for the servers we start: never from the kernel's ephemeral range (where an outgoing connection
can take the port before the server binds it: a real CI failure, "address already in use"), never the
same one twice in a process, and free when handed out."""
from __future__ import annotations

import socket
from pathlib import Path

from services.core.ports import free_port, port_free


def test_ports_are_free_distinct_and_outside_the_ephemeral_range():
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert not [p for p in ports if low <= p <= high]
    for port in ports[:50]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # raises if something holds it



def test_a_port_someone_listens_on_is_not_free():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", free_port()))
        sock.listen()
        port = sock.getsockname()[1]
        assert not port_free("127.0.0.1", port)
    assert port_free("127.0.0.1", port)
