"""What `POST /register` accepts, beyond the body's schema: where a registered server may live
(a host allow-list, never the head itself) and how large and deep its extra fields may be.

The head probes and proxies to every registered URL, so an open registry would let anyone
make it call any host:port (a port scanner) or itself (a request loop). Each refusal is a
4xx that names the field.
"""
from __future__ import annotations

import ipaddress
import json
import os
import socket
from typing import Any

from services.core.errors import BadRequest

# loopback plus the service names of docker-compose.yml (a compose head allows its own network)
DEFAULT_ALLOWED_HOSTS = ("127.0.0.0/8", "::1", "localhost")
ALLOWED_HOSTS_ENV = "GYMSERVE_ALLOWED_HOSTS"
MAX_REGISTRATION_BYTES = 16 * 1024
MAX_EXTRA_BYTES = 4 * 1024
MAX_EXTRA_DEPTH = 8


def network_hosts() -> frozenset[str]:
    """The names in GYMSERVE_ALLOWED_HOSTS: the stack's own network (compose or k8s service names),
    whose servers are trusted with the key. Loopback is allowed but not trusted: any local process
    can listen there."""
    return frozenset(h.strip().lower() for h in os.environ.get(ALLOWED_HOSTS_ENV, "").split(",") if h.strip())


def allowed_hosts() -> list[str]:
    """The default allow-list: GYMSERVE_ALLOWED_HOSTS (comma-separated names, IPs or CIDRs), else loopback."""
    extra = [h.strip() for h in os.environ.get(ALLOWED_HOSTS_ENV, "").split(",") if h.strip()]
    return [*DEFAULT_ALLOWED_HOSTS, *extra]


def _matches(host: str, rule: str) -> bool:
    host = host.strip("[]").lower()
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(rule, strict=False)
    except ValueError:
        return host == rule.lower()


def host_allowed(host: str, rules: list[str]) -> bool:
    return any(_matches(host, rule) for rule in rules)


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, counted without recursion (stops once past `limit`)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def check_extras(extra: dict[str, Any]) -> None:
    """Extra fields come back in every `GET /server_instances`: small and shallow only."""
    for key, value in extra.items():
        if _depth(value, MAX_EXTRA_DEPTH) > MAX_EXTRA_DEPTH:
            raise BadRequest(f"{key}: nested deeper than {MAX_EXTRA_DEPTH} levels")
    size = len(json.dumps(extra, default=str))
    if size > MAX_EXTRA_BYTES:
        raise BadRequest(f"{', '.join(sorted(extra))}: extra fields take {size} bytes; at most {MAX_EXTRA_BYTES}",
                         status_code=413)


def _local_addresses() -> set[str]:
    out = {"localhost", socket.gethostname().lower()}
    try:
        out.update(a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None))
    except OSError:
        pass
    return out


def points_at_head(host: str, port: int, head_port: int, head_names: set[str]) -> bool:
    """True when host:port is this head: its port on a loopback or local address, or one of its names."""
    if port != head_port:
        return False
    host = host.strip("[]").lower()
    if host in head_names or host in _local_addresses():
        return True
    try:
        return ipaddress.ip_address(host).is_loopback or ipaddress.ip_address(host).is_unspecified
    except ValueError:
        pass
    try:
        resolved = {a[4][0] for a in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
    except OSError:
        return False
    local = _local_addresses()
    return any(ipaddress.ip_address(a).is_loopback or a in local for a in resolved)


def check_address(field: str, host: str, port: int, *, rules: list[str], head_port: int,
                  head_names: set[str]) -> None:
    if not host_allowed(host, rules):
        raise BadRequest(f"{field}: host {host!r} is not in the head's allow-list ({', '.join(rules)}; "
                         f"extend it with {ALLOWED_HOSTS_ENV} or the head's allowed_hosts option)", status_code=422)
    if points_at_head(host, port, head_port, head_names):
        raise BadRequest(f"{field}: {host}:{port} is the head itself; a server cannot be registered there",
                         status_code=422)
