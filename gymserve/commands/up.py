"""`gymserve up [-c STACK.yaml ...] [key=value ...]`: the head and every server of a stack, locally."""
from __future__ import annotations

import argparse
import asyncio
import os
import secrets
from pathlib import Path

from services.core.auth import NO_AUTH_ENV, ensure_key_file
from services.core.config import ConfigError, Stack, load_stack
from services.core.hosts import is_loopback
from services.core.registration import STACK_TOKEN_ENV

DEFAULT_STACK = Path(__file__).resolve().parent.parent / "stacks" / "default.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", action="append", default=[], metavar="STACK.yaml",
                        help="stack file (repeatable; later files override earlier ones); "
                             "default: the embedded default stack")
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="stack overrides, e.g. head.port=12000 servers.math.workers=2")
    parser.add_argument("--ready-timeout", type=float, default=600.0, metavar="S",
                        help="seconds to wait for every server's /ready (default 600)")
    parser.add_argument("--no-restart", action="store_true", help="do not restart a crashed server")
    parser.add_argument("--no-auth", action="store_true",
                        help="no bearer key (loopback heads only; refused when the head binds beyond 127.0.0.1/::1)")
    parser.add_argument("--backend", choices=("process", "ray"), default="process",
                        help="process: one local process per server (default); ray: every server as a Ray Serve "
                             "deployment (stack entries may set replicas, num_cpus, num_gpus, "
                             "max_ongoing_requests, autoscaling)")
    ray = parser.add_argument_group("--backend ray")
    ray.add_argument("--address", default=None, metavar="ADDR",
                     help="join the Ray cluster at ADDR (e.g. 10.0.0.1:6379 or auto); default: start a local Ray "
                          "and shut it down on exit")
    ray.add_argument("--serve-host", default=None, metavar="HOST",
                     help="Serve HTTP proxy bind address (default: the head's host)")
    ray.add_argument("--serve-port", type=int, default=0, metavar="PORT",
                     help="Serve HTTP proxy port (default: a free one)")
    ray.add_argument("--num-cpus", type=float, default=None, metavar="N",
                     help="CPUs a local Ray offers (default: all of this machine's)")
    ray.add_argument("--ray-temp-dir", default=None, metavar="DIR",
                     help="a local Ray's session and log folder (default: Ray's, under the system temp dir)")
    ray.add_argument("--ray-dashboard", action="store_true", help="start a local Ray's dashboard")


def run(args: argparse.Namespace) -> int:
    from gymserve.launcher import Launcher, plan
    from gymserve.nemo_gym.prepare import prepare_stack

    files = args.config or [str(DEFAULT_STACK)]
    stack = load_stack(files, args.overrides)
    prepare_stack(stack, where=", ".join(files))  # NeMo-Gym servers' virtualenvs, built once
    if args.backend == "ray":
        return _run_ray(args, stack, where=", ".join(files))
    children = plan(stack, where=", ".join(files))
    print(f"[gymserve] {prepare_auth(stack, no_auth=args.no_auth)}", flush=True)
    for child in children:
        apply_auth_env(child.env)
    launcher = Launcher(children, ready_timeout_s=args.ready_timeout, restart=not args.no_restart)
    return asyncio.run(launcher.run())


def prepare_auth(stack: Stack, *, no_auth: bool) -> str:
    """Make sure the stack runs with a bearer key, and hand it (and the stack token) to the children through
    our environment: GYMSERVE_API_KEY if set, else a key file (generated 0600 when missing). Returns the line
    to print: where the key is, never the key."""
    os.environ[STACK_TOKEN_ENV] = secrets.token_urlsafe(32)  # lets our own children re-point stack entries
    if no_auth or os.environ.get(NO_AUTH_ENV) == "1":
        if not is_loopback(stack.head.host):
            raise ConfigError(f"head.host: {stack.head.host} is beyond loopback; --no-auth is only allowed for a "
                              "head on 127.0.0.1 or ::1 (drop --no-auth: a key is generated for you)")
        os.environ[NO_AUTH_ENV] = "1"
        os.environ.pop("GYMSERVE_API_KEY", None)
        os.environ.pop("GYMSERVE_API_KEY_FILE", None)
        return "authentication is OFF (--no-auth): any local process can use and re-register servers"
    if os.environ.get("GYMSERVE_API_KEY"):
        return "bearer key: from GYMSERVE_API_KEY"
    path = ensure_key_file()
    os.environ["GYMSERVE_API_KEY_FILE"] = str(path)
    return f"bearer key: in {path} (clients on this machine find it there; send Authorization: Bearer <key>)"


AUTH_VARS = ("GYMSERVE_API_KEY", "GYMSERVE_API_KEY_FILE", NO_AUTH_ENV, STACK_TOKEN_ENV)


def apply_auth_env(env: dict[str, str]) -> None:
    """A child's environment gets the auth settings `prepare_auth` chose (and loses any it dropped)."""
    for name in AUTH_VARS:
        if name in os.environ:
            env[name] = os.environ[name]
        else:
            env.pop(name, None)


def _run_ray(args: argparse.Namespace, stack, *, where: str) -> int:
    from gymserve.ray_backend import RayCluster, RayLauncher, check_available, plan_deployments

    check_available()
    head, deployments = plan_deployments(stack, where=where)
    print(f"[gymserve] {prepare_auth(stack, no_auth=args.no_auth)}", flush=True)
    apply_auth_env(head.env)
    cluster = RayCluster(address=args.address, serve_host=args.serve_host or stack.head.host,
                         serve_port=args.serve_port, num_cpus=args.num_cpus, temp_dir=args.ray_temp_dir,
                         dashboard=args.ray_dashboard)
    launcher = RayLauncher(head, deployments, cluster, ready_timeout_s=args.ready_timeout,
                           restart=not args.no_restart)
    return asyncio.run(launcher.run())
