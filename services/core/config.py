"""Configuration: per-server settings, YAML stack files, `key=value` overrides, `${ENV}` interpolation.

Secrets come from the environment (`${VAR}`) or a file (`<name>_file: PATH`), never argv.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .redaction import is_secret_name, redact  # noqa: F401  (redact: re-exported for callers)

DEFAULT_HEAD_PORT = 11000
_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    """A configuration problem; the message names the file and the key."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads `1e-4` as a number (YAML 1.2); PyYAML's YAML 1.1 reads it as a string."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
                              list("-+0123456789."))


def load_yaml(text: str) -> Any:
    """`yaml.safe_load` with YAML 1.2 exponent floats: every config file and override goes through it."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


class ServerConfig(BaseModel):
    """Settings every server has. Each server's `Config` subclasses it with its own options."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    name: str = Field("server", description="instance name, as the head and agent_ref know it")
    kind: str = Field("", description="implementation, e.g. resources/math")
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    head_url: str | None = Field(default_factory=lambda: os.environ.get("GYMSERVE_HEAD_URL") or None)
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0, description="larger request bodies get 413")
    max_json_depth: int = Field(64, gt=0, description="JSON bodies nested deeper get 400")
    header_timeout_s: float = Field(10.0, gt=0, description="a request's headers must arrive within this (else 408)")
    max_header_bytes: int = Field(64 * 1024, ge=1024, description="request line and headers larger than this "
                                  "get 431, before anything else (the key check included) reads them")
    body_timeout_s: float = Field(60.0, gt=0, description="a request's body must arrive within this (else 408)")
    heartbeat_s: float = Field(5.0, gt=0)
    max_concurrent_requests: int = Field(256, gt=0, description="requests whose handlers run at once; "
                                                               "more wait in arrival order")
    max_queued_requests: int = Field(4096, ge=0, description="requests that may wait for a slot; beyond "
                                                            "that a request gets 503 with Retry-After at once")
    retry_after_s: float = Field(1.0, gt=0, description="Retry-After of a 503 from a full queue (whole seconds)")
    max_queue_wait_s: float | None = Field(None, gt=0, description="a request waiting longer for a slot gets 503 "
                                                                   "(unset: waits until its turn)")
    register_with_head: bool = Field(True, description="heartbeat to the head at head_url; off when something else "
                                             "registers this server (the Ray backend registers its deployments)")
    cpu_policy: Literal["normal", "batch"] = Field(
        "normal", description="Linux scheduling policy of the server's process (`gymserve serve`): `batch` "
        "(SCHED_BATCH) lets a request that wakes the server wait for a busy CPU's turn instead of preempting "
        "it, so a server that mostly forwards yields to CPU-bound servers on the same cores")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class AutoscalingSpec(BaseModel):
    """Replica bounds for the Ray backend (Ray Serve's autoscaling); the process backend ignores them."""

    model_config = ConfigDict(extra="forbid")

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    target_ongoing_requests: float = Field(2.0, gt=0, description="requests in flight per replica to aim for")
    upscale_delay_s: float = Field(30.0, ge=0)
    downscale_delay_s: float = Field(600.0, ge=0)
    look_back_period_s: float = Field(30.0, gt=0, description="window the load is averaged over")

    @model_validator(mode="after")
    def _bounds(self) -> "AutoscalingSpec":
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})")
        return self


# keys of a stack entry that say how to scale a server rather than how it behaves
SCALING_KEYS = ("replicas", "num_cpus", "num_gpus", "max_ongoing_requests", "autoscaling")


class ServerSpec(BaseModel):
    """One server instance of a stack. The scaling fields are read by the Ray backend only:
    the process backend runs exactly one process per server whatever they say."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    options: dict[str, Any] = Field(default_factory=dict)
    replicas: int = Field(1, ge=1, description="Ray backend: fixed number of replicas")
    num_cpus: float = Field(0.0, ge=0, description="Ray backend: CPUs reserved per replica")
    num_gpus: float = Field(0.0, ge=0, description="Ray backend: GPUs per replica (fractions share one)")
    max_ongoing_requests: int | None = Field(None, ge=1, description="Ray backend: requests a replica takes at once")
    autoscaling: AutoscalingSpec | None = Field(None, description="Ray backend: replica bounds (replaces replicas)")


class HeadSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_HEAD_PORT, ge=0, le=65535)
    openrlhf_environment: str | None = Field(None, description="resource server that /get_reward scores with")


class Stack(BaseModel):
    model_config = ConfigDict(extra="forbid")

    head: HeadSpec = Field(default_factory=HeadSpec)
    servers: dict[str, ServerSpec] = Field(default_factory=dict)


# --------------------------------------------------------------------------- #
# Interpolation, secrets, overrides
# --------------------------------------------------------------------------- #
def interpolate(value: Any, *, where: str = "config") -> Any:
    """Replace `${VAR}` and `${VAR:-default}` in every string, recursively."""
    if isinstance(value, str):
        def sub(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise ConfigError(f"{where}: environment variable {name} is not set")

        return _ENV_PATTERN.sub(sub, value)
    if isinstance(value, dict):
        return {k: interpolate(v, where=f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, where=f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def resolve_secret_files(options: dict[str, Any], *, where: str = "config") -> dict[str, Any]:
    """`api_key_file: PATH` becomes `api_key: <file contents>` for secret-named keys."""
    out = dict(options)
    for key in list(out):
        if key.endswith("_file") and is_secret_name(key[: -len("_file")]) and out[key]:
            target = key[: -len("_file")]
            try:
                out[target] = Path(str(out[key])).expanduser().read_text().strip()
            except OSError as exc:
                raise ConfigError(f"{where}.{key}: cannot read secret file: {exc.strerror}") from None
            del out[key]
    return out


REPLACE_KEY = "_replace"  # in a stack file: this mapping replaces the one merged so far instead of merging
DELETE = object()  # the value of a `~a.b` override: remove the key


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as a YAML scalar/flow value); `~a.b.c` -> DELETE."""
    if text.startswith("~"):
        path = [p for p in text[1:].strip().split(".") if p]
        if not path or "=" in text:
            raise ConfigError(f"override {text!r}: expected ~key (remove the key), e.g. ~servers.math.workers")
        return path, DELETE
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value, or ~key to remove a key")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                if value is DELETE:
                    raise ConfigError(f"override {text!r}: there is no {'.'.join(path)} to remove")
                child = {}
                node[part] = child
            node = child
        if value is DELETE:
            if path[-1] not in node:
                raise ConfigError(f"override {text!r}: there is no {'.'.join(path)} to remove")
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return data


# --------------------------------------------------------------------------- #
# Stacks
# --------------------------------------------------------------------------- #
def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = load_yaml(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Later files win key by key; a mapping with `_replace: true` replaces the earlier one whole."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict):
            replace = value.get(REPLACE_KEY) is True or not isinstance(out.get(key), dict)
            value = {k: v for k, v in value.items() if k != REPLACE_KEY}
            out[key] = _merge({} if replace else out[key], value)
        else:
            out[key] = value
    return out


def _normalise_server(name: str, raw: Any, where: str) -> dict[str, Any]:
    """Accept flat options (`kind`, `port`, anything else) or a nested `options:` mapping."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: servers.{name} must be a mapping")
    raw = dict(raw)
    spec: dict[str, Any] = {k: raw.pop(k) for k in ("kind", "host", "port", *SCALING_KEYS) if k in raw}
    options = dict(raw.pop("options", None) or {})
    options.update(raw)
    spec["options"] = options
    return spec


def load_stack(paths: Iterable[str | Path] = (), overrides: Iterable[str] = (), *, base: dict[str, Any] | None = None) -> Stack:
    """Read and merge stack files, apply overrides, and validate (errors name file and key)."""
    data: dict[str, Any] = dict(base or {})
    sources = [str(p) for p in paths] or ["<default stack>"]
    for path in paths:
        data = _merge(data, _read_yaml(Path(path)))
    data = apply_overrides(data, overrides)
    where = ", ".join(sources)
    servers = data.get("servers") or {}
    if not isinstance(servers, dict):
        raise ConfigError(f"{where}: servers must be a mapping of instance name to server")
    data["servers"] = {name: _normalise_server(name, raw, where) for name, raw in servers.items()}
    try:
        return Stack.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {describe_validation_error(exc)}") from None


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def build_server_config(config_cls: type[ServerConfig], values: dict[str, Any], *, where: str) -> ServerConfig:
    """Validate one server's settings; secrets resolved, `${ENV}` interpolated, errors name the key."""
    values = resolve_secret_files(interpolate(values, where=where), where=where)
    try:
        return config_cls.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {describe_validation_error(exc)}") from None


def spec_from_env() -> dict[str, Any]:
    """The settings `gymserve up` hands a child through GYMSERVE_SERVER_SPEC (never argv)."""
    raw = os.environ.get("GYMSERVE_SERVER_SPEC")
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"GYMSERVE_SERVER_SPEC: invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError("GYMSERVE_SERVER_SPEC: must be a JSON object")
    return data
