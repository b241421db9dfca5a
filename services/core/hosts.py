"""Bind address -> address to connect to, in one place (the head, the launcher and registration agree)."""
from __future__ import annotations

import ipaddress

# Addresses that mean "every interface" when bound; nobody can connect to them as such.
ANY_ADDRESSES = frozenset({"0.0.0.0", "::", ""})


def connect_host(host: str) -> str:
    """The address to connect to for a bind address: a wildcard bind means this machine's loopback."""
    if host in ANY_ADDRESSES:
        return "::1" if host == "::" else "127.0.0.1"
    return host


def connect_url(host: str, port: int, scheme: str = "http") -> str:
    """`scheme://host:port` for a bind address (IPv6 literals in brackets)."""
    target = connect_host(host)
    if ":" in target and not target.startswith("["):
        target = f"[{target}]"
    return f"{scheme}://{target}:{port}"


def is_loopback(host: str) -> bool:
    """True for a bind address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"
