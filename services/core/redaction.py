"""Secrets never leave a server: the one redaction used for config, registry rows, errors and failure reasons.

Three rules. A value is hidden when its *name* looks secret (`SECRET_PATTERN`: key, token, secret,
password, pass, pwd, bearer, credential(s), authorization, auth, cookie, private key, signature,
...), including `{"name": "Authorization", "value": "..."}` header pairs. A string is scrubbed
when its *shape* is a secret whatever its name: a credential after any `Authorization` scheme
(`Bearer`, `Basic`, `Token`, ...), PEM private-key blocks, URL userinfo (`user:pass@` and a
token alone, `TOKEN@`), `name=value` / `name: value` / `--name value` where the name looks
secret (query strings included), and the token formats of the common providers (GitHub, GitLab,
OpenAI, Anthropic, Hugging Face, AWS, Google, Slack, Stripe, npm, PyPI, JWTs). And the value of
every secret-named environment variable of this process is masked wherever it appears: a
`${HF_TOKEN}` that a config put under a neutral name (`model_args`) or that an error message
quotes is hidden by what it is, not by where it sits.
"""
from __future__ import annotations

import os
import re
from typing import Any

MASK = "***"

# Matched anywhere in a key (case-insensitive): `api_key`, `X-Auth-Token`, `db_pass`, `PGPASSWORD`...
SECRET_PATTERN = re.compile(
    r"key|token|secret|passw|pass(?:$|[^a-z])|^pass|pwd|bearer|credential|authori[sz]ation|auth(?:$|[^o])|"
    r"cookie|private|signature|passphrase|(?:^|[^a-z])(?:creds?|sig)(?:$|[^a-z])",
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
# `https://TOKEN@host`: userinfo with no password is a credential when it looks like one (`git@` stays)
_TOKEN_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)([^/\s:@'\"]+)@")
# `Authorization: <scheme> <credential>` for any scheme (`Token`, `Digest`, `ApiKey`, `SSWS`...)
_AUTH_SCHEME = re.compile(r"(\b(?:proxy-)?authori[sz]ation[\"']?\s*[:=]\s*[\"']?[A-Za-z][\w-]*\s+)(?!<)([^\s,;'\")\]}]+)",
                          re.IGNORECASE)
# `name=value`, `name: value`, `"name": "value"` with any name (checked by `is_secret_name`)
_ASSIGNMENT = re.compile(r"(\b([A-Za-z][\w.-]*)[\"']?\s*([=:])(?!//)\s*[\"']?)(?!(?i:bearer|basic)\b)(?!<)(?!\*\*\*)"
                         r"([^\s,&;'\")\]}]+)")
# `--password hunter2`, `-token abc` on a command line
_FLAG = re.compile(r"(\s--?([A-Za-z][\w-]*)\s+)(?!-)([^\s'\"]+)")
_CREDENTIAL_LOOK = re.compile(r"[0-9._~+/=-]|.{12}")
# providers' token formats, recognised with no name around them
_PROVIDER_TOKENS = re.compile("|".join((
    r"\bgh[pousr]_[A-Za-z0-9]{20,}", r"\bgithub_pat_[A-Za-z0-9_]{20,}", r"\bglpat-[A-Za-z0-9_-]{20,}",
    r"\bsk-(?:proj-|ant-|svcacct-)?[A-Za-z0-9_-]{20,}", r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}",
    r"\bhf_[A-Za-z0-9]{20,}", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", r"\bAIza[0-9A-Za-z_-]{35}",
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}", r"\bnpm_[A-Za-z0-9]{36}", r"\bpypi-[A-Za-z0-9_-]{40,}",
    r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
)))
# an environment variable's value is masked by value from this length on (shorter ones are words, flags)
MIN_ENV_SECRET_CHARS = 8


def is_secret_name(name: object) -> bool:
    """True for a key whose value must never be shown."""
    text = str(name)
    return bool(SECRET_PATTERN.search(text)) and not _NOT_SECRET.match(text)


def environment_secrets() -> list[str]:
    """Values of this process's secret-named environment variables (`HF_TOKEN`, `GYMSERVE_API_KEY`...),
    longest first, so a config or a message that carries one is masked whatever names it."""
    values = {value for name, value in os.environ.items()
              if len(value) >= MIN_ENV_SECRET_CHARS and is_secret_name(name)}
    return sorted(values, key=len, reverse=True)


def redact_text(text: str) -> str:
    """`text` with every secret-shaped part masked (credentials after an Authorization scheme, PEM
    private keys, URL userinfo, secret-named assignments and flags, providers' token formats, the
    values of secret-named environment variables)."""
    if not text:
        return text
    for value in environment_secrets():
        if value in text:
            text = text.replace(value, MASK)
    text = _PEM.sub(f"-----BEGIN \\1-----{MASK}-----END \\1-----", text)
    text = _AUTH_SCHEME.sub(lambda m: f"{m.group(1)}{MASK}" if m.group(2) != MASK else m.group(0), text)
    text = _BEARER.sub(lambda m: f"{m.group(1) or m.group(2)} {MASK}", text)
    text = _USERINFO.sub(lambda m: f"{m.group(1)}{m.group(2)}:{MASK}@", text)
    text = _TOKEN_USERINFO.sub(_token_userinfo, text)
    text = _PROVIDER_TOKENS.sub(MASK, text)
    text = _FLAG.sub(_flag, text)
    return _assignments(text)


def _assignments(text: str) -> str:
    """`_ASSIGNMENT` replaced left to right; a name that is not secret keeps its value unread, so an
    assignment inside that value (`failed: https://host/?access_token=...`) is still found."""
    out, pos = [], 0
    while (match := _ASSIGNMENT.search(text, pos)) is not None:
        replaced = _assignment(match)
        if replaced == match.group(0):
            out.append(text[pos:match.end(1)])
            pos = match.end(1)
        else:
            out.append(text[pos:match.start()] + replaced)
            pos = match.end()
    out.append(text[pos:])
    return "".join(out)


def _token_userinfo(match: re.Match[str]) -> str:
    user = match.group(2)
    if user == MASK or not _CREDENTIAL_LOOK.search(user):
        return match.group(0)
    return f"{match.group(1)}{MASK}@"


def _flag(match: re.Match[str]) -> str:
    if not is_secret_name(match.group(2)) or match.group(3) == MASK:
        return match.group(0)
    return f"{match.group(1)}{MASK}"


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
