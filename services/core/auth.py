"""Bearer auth: every endpoint but /, /health and /ready. The key never travels in argv.

Where the key comes from, in order: `GYMSERVE_API_KEY`, the file named by
`GYMSERVE_API_KEY_FILE`; clients (the CLI, the trainer) then fall back to the default key file
that `gymserve up` writes when it generates a key (`default_key_file()`, `adopt_default_key`).
A server enforces the key only when it was given one explicitly; `gymserve up` always gives
its children one.

The key is sent only to origins this process trusts: the head it was given and the servers the
head lists as started by its stack (`trust`), never to a URL that merely registered itself.
"""
from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit

# `/openenv/health`: the liveness probe of the OpenEnv binding (OpenEnv's providers poll it)
OPEN_PATHS = frozenset({"/", "/health", "/ready", "/openenv/health"})
NO_AUTH_ENV = "GYMSERVE_NO_AUTH"  # "1": the loopback-only opt-out of `gymserve up --no-auth`

_trusted: set[str] = set()
log = logging.getLogger("gymserve.auth")


def default_key_file() -> Path:
    """`$XDG_CONFIG_HOME/gymserve/api_key` (default `~/.config/gymserve/api_key`)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gymserve" / "api_key"


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


_key_file: tuple[str, tuple[int, int, int] | None, str] | None = None  # (path, its stat, its key)
# The key while GYMSERVE_API_KEY_FILE names a file that cannot be read (or is empty): one nobody
# holds, so a removed or broken key file closes the server instead of opening it.
_UNREADABLE_KEY_FILE = secrets.token_urlsafe(32)


def _read_key_file(path: str) -> str:
    """The key in `path`, read again only when the file changed: servers check the key on every
    request, and a stat costs a fraction of an open and a read. A rotated file (rewritten or
    replaced) is read on the next request."""
    global _key_file
    try:
        st = os.stat(path)
        stamp: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None  # no such file (or no access to it)
    if _key_file is None or _key_file[:2] != (path, stamp):
        key = _read(path) if stamp else None
        if key is None:  # said once per change of the file, not per request
            log.warning("GYMSERVE_API_KEY_FILE=%s cannot be read or is empty: every request is refused "
                        "(and a client sends no valid key) until it holds the key", path)
        _key_file = (path, stamp, key or _UNREADABLE_KEY_FILE)
    return _key_file[2]


def api_key() -> str | None:
    """The key this server enforces and sends: GYMSERVE_API_KEY, else the GYMSERVE_API_KEY_FILE file."""
    environ = os.environ
    if environ.get(NO_AUTH_ENV) == "1":
        return None
    key = environ.get("GYMSERVE_API_KEY")
    if not key:
        path = environ.get("GYMSERVE_API_KEY_FILE")
        key = _read_key_file(path) if path else None
    return key or None


def adopt_default_key() -> None:
    """For clients (the CLI, the trainer): with no key given, use the default key file `gymserve up`
    wrote, by pointing GYMSERVE_API_KEY_FILE at it (so child processes find it too)."""
    if os.environ.get("GYMSERVE_API_KEY") or os.environ.get("GYMSERVE_API_KEY_FILE"):
        return
    if _read(default_key_file()) is not None:
        os.environ["GYMSERVE_API_KEY_FILE"] = str(default_key_file())


def ensure_key_file(path: Path | None = None) -> Path:
    """The key file to hand to a stack: GYMSERVE_API_KEY_FILE's or the default one, created (0600, random
    key) when it does not exist yet. The key itself is never printed."""
    path = Path(path or os.environ.get("GYMSERVE_API_KEY_FILE") or default_key_file())
    if _read(path) is None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    os.chmod(path, 0o600)
    return path


def origin(url: str) -> str:
    """`scheme://host:port` of a URL, lower-cased, with the default port filled in."""
    parts = urlsplit(url)
    scheme = (parts.scheme or "http").lower()
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        return ""
    return f"{scheme}://{(parts.hostname or '').lower()}:{port}"


def trust(url: str) -> None:
    """Allow the key to be sent to `url`'s origin (the head, a server the stack started)."""
    if url:
        _trusted.add(origin(url))


def trusted(url: str) -> bool:
    head = os.environ.get("GYMSERVE_HEAD_URL")
    return origin(url) in _trusted or bool(head and origin(url) == origin(head))


def auth_headers(url: str | None = None) -> dict[str, str]:
    """The bearer header for a call to `url` (omitted for an origin not trusted); `url=None`: a call
    whose target the caller chose itself (the CLI's `--head`)."""
    if url is not None and not trusted(url):
        return {}
    key = api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def authorized(header_value: str | None, key: str) -> bool:
    if not header_value:
        return False
    scheme, _, token = header_value.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
