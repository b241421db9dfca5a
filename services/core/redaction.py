"""Secrets never leave a server: the one redaction used for config, registry rows, errors and failure reasons.

Two rules. A value is hidden when its *name* looks secret (`SECRET_PATTERN`: key, token, secret,
password, pass, pwd, bearer, credential(s), authorization, auth, cookie, private key, signature,
...), including `{"name": "Authorization", "value": "..."}` header pairs. And a string is
scrubbed when its *shape* is a secret whatever its name: `Bearer <token>` / `Basic <token>`,
PEM private-key blocks, and the password of URL userinfo (`scheme://user:pass@host`).
"""
from __future__ import annotations

import re
from typing import Any

MASK = "***"

# Matched anywhere in a key (case-insensitive): `api_key`, `X-Auth-Token`, `db_pass`, `PGPASSWORD`...
SECRET_PATTERN = re.compile(
    r"key|token|secret|passw|pass(?:$|[^a-z])|^pass|pwd|bearer|credential|authori[sz]ation|auth(?:$|[^o])|"
    r"cookie|private|signature",
    re.IGNORECASE,
)
# Names that contain a secret-looking word but hold nothing secret (`passed` tests, `bypass` flags).
_NOT_SECRET = re.compile(r"^(?:\w*passed|pass_rate|passes|bypass\w*|\w*tokenizer\w*|"
                         r"\w*(?:prompt|completion|input|output|total|cached|reasoning|generation|new|num)_tokens\w*|max_\w*tokens?\w*|"
                         r"\w*token_ids|\w*_token_extras|(?:end|eos|bos|pad|stop|sep|unk|special)_tokens?\w*|"
                         r"\w*_keys?_count|sort_keys)$", re.IGNORECASE)

# What follows Bearer / Basic must look like a credential (a digit or symbol, 12+ characters, or aB for base64),
# so that prose such as "a bearer token" or "Basic idea" stays readable.
_BEARER = re.compile(r"\b((?i:bearer))\s+(?=[A-Za-z0-9._~+/=-]*[0-9._~+/=-]|[A-Za-z0-9._~+/=-]{12})[A-Za-z0-9._~+/=-]{4,}"
                     r"|\b((?i:basic))\s+(?=[A-Za-z0-9+/]*(?:[0-9+/=]|[a-z][A-Z]))[A-Za-z0-9+/]{6,}=*")
_PEM = re.compile(r"-----BEGIN ([A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*)-----.*?(?:-----END \1-----|\Z)", re.DOTALL)
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)([^/\s:@'\"]*):([^/\s@'\"]*)@")
_ASSIGNMENT = re.compile(r"(\b([\w-]*(?:api[_-]?key|token|secret|password|passwd|pwd|authorization)[\w-]*)[\"']?\s*"
                         r"([=:])\s*[\"']?)(?!(?i:bearer|basic)\b)(?!<)([^\s,&;'\")\]}]+)", re.IGNORECASE)
_CREDENTIAL_LOOK = re.compile(r"[0-9._~+/=-]|.{12}")


def is_secret_name(name: object) -> bool:
    """True for a key whose value must never be shown."""
    text = str(name)
    return bool(SECRET_PATTERN.search(text)) and not _NOT_SECRET.match(text)


def redact_text(text: str) -> str:
    """`text` with every secret-shaped part masked (tokens after Bearer/Basic, PEM private keys,
    URL passwords, `password=...` / `Authorization: ...` assignments)."""
    if not text:
        return text
    text = _PEM.sub(f"-----BEGIN \\1-----{MASK}-----END \\1-----", text)
    text = _BEARER.sub(lambda m: f"{m.group(1) or m.group(2)} {MASK}", text)
    text = _USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:{MASK}@", text)
    return _ASSIGNMENT.sub(_assignment, text)


def _assignment(match: re.Match[str]) -> str:
    """`password=...` is always masked; `token: ...` only when the value looks like a credential, so an
    error message such as `api_key: expected a string` keeps its words."""
    name, separator, value = match.group(2), match.group(3), match.group(4)
    if not is_secret_name(name) or (separator == ":" and not _CREDENTIAL_LOOK.search(value)):
        return match.group(0)
    return f"{match.group(1)}{MASK}"


def _is_header_pair(value: dict[Any, Any]) -> bool:
    name = value.get("name", value.get("key"))
    return isinstance(name, str) and "value" in value and is_secret_name(name)


def _hidden(value: Any) -> Any:
    """The value of a secret-named key: scalars masked, structures walked (`auth: {user, password}`)."""
    if isinstance(value, dict):
        return redact(value)
    if isinstance(value, (list, tuple)):
        return [_hidden(v) for v in value]
    return value if value in (None, "") or isinstance(value, bool) else MASK


def redact(value: Any) -> Any:
    """A copy of `value` (config, registry rows, any JSON) with every secret hidden: secret-named keys'
    values become `***`, `{name, value}` pairs naming a secret lose their value, and every string is
    scrubbed of secret shapes."""
    if isinstance(value, dict):
        if _is_header_pair(value):
            return {k: (MASK if k == "value" and v not in (None, "") else redact(v)) for k, v in value.items()}
        return {k: (_hidden(v) if is_secret_name(k) else redact(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return redact_text(value)
    return value
