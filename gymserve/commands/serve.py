"""`gymserve serve KIND/NAME [--port P] [key=value ...]`: one server in the foreground."""
from __future__ import annotations

import argparse
import logging

from services.core.config import ConfigError, apply_overrides, build_server_config, spec_from_env
from services.core.loader import load_server
from services.core.ports import free_port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", help="head, resources/<env>, agents/<agent> or models/<backend>")
    parser.add_argument("--port", type=int, default=None, help="port (default: the config's, else a free one)")
    parser.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    parser.add_argument("--name", default=None, help="instance name (default: the kind's last part)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="server options")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level")
    # key=value overrides may also come after the flags (argparse leaves those in args.extra)
    parser.set_defaults(accepts_extra=True)


def load_kind(kind: str):
    """The module serving `kind`: the `nemo_gym/` family is NeMo-Gym's servers behind our sidecar, the
    rest is the loader's."""
    from gymserve.nemo_gym import is_nemo_kind

    if is_nemo_kind(kind):
        from gymserve.nemo_gym import sidecar

        sidecar.nemo_server_name(kind)
        return sidecar
    return load_server(kind)


def load_config(kind: str, overrides: list[str], *, name: str | None = None, host: str | None = None,
                port: int | None = None, spec: dict | None = None):
    """Module and validated config of one server: its spec (default GYMSERVE_SERVER_SPEC), then
    key=value, then flags. Every backend builds a server through here and `module.build`."""
    module = load_kind(kind)
    values = dict(spec_from_env() if spec is None else spec)
    values = apply_overrides(values, overrides)
    values["kind"] = kind
    values.setdefault("name", name or kind.rsplit("/", 1)[-1])
    if name:
        values["name"] = name
    if host:
        values["host"] = host
    if port is not None:
        values["port"] = port
    config = build_server_config(module.Config, values, where=f"{kind} options")
    return module, config


def serve(module, config, *, log_level: str = "warning", kind: str = "") -> None:
    """Run one built server in the foreground (its port: the config's, else a free one)."""
    import uvicorn

    from services.core.serving import guarded_protocol, set_cpu_policy, tune_gc

    if not config.port:
        config.port = free_port(config.host)
    app = module.build(config)
    tune_gc()
    set_cpu_policy(config.cpu_policy)
    logging.getLogger("gymserve").info("%s (%s) listening on %s", config.name, kind or config.kind, config.url)
    protocol = guarded_protocol(config.header_timeout_s, config.max_header_bytes)
    uvicorn.run(app, host=config.host, port=config.port, log_level=log_level, access_log=False,
                timeout_graceful_shutdown=10, timeout_keep_alive=30, http=protocol)


def run(args: argparse.Namespace) -> int:
    stray = [a for a in getattr(args, "extra", []) if "=" not in a or a.startswith("-")]
    if stray:
        raise ConfigError(f"unrecognized arguments: {' '.join(stray)}")
    overrides = list(args.overrides) + [a for a in getattr(args, "extra", []) if a not in stray]
    module, config = load_config(args.kind, overrides, name=args.name, host=args.host, port=args.port)
    serve(module, config, log_level=args.log_level, kind=args.kind)
    return 0
