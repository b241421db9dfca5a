"""`gymserve up --backend ray`: every server of a stack as a Ray Serve deployment.

One code path for a server whatever runs it: a replica builds its app with the same
`load_config` + `module.build(config)` as `gymserve serve`, and Serve runs the app's
lifespan, so worker pools and sandboxes start inside the replica (their processes die
with it: the pool asks the kernel to kill them when the replica's process goes).

Each server is one Serve application mounted at `/<name>` behind Serve's HTTP proxy.
The head stays a plain child process (the same supervision as the process backend) and
this launcher registers every deployment with it under its instance name, with the
proxy URL and the replicas' state, every couple of seconds. Replicas themselves do not
register (`register_with_head=False`), so a replica that Ray replaces changes nothing the head
sees except the replica counts.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, TextIO

import httpx

from services.core.app import server_type_name
from services.core.affinity import SESSION_STORE_ENV
from services.core.auth import api_key, auth_headers
from services.core.client import shared_client
from services.core.config import ConfigError, ServerSpec, Stack, interpolate
from services.core.hosts import ANY_ADDRESSES, connect_host
from services.core.ports import free_port
from services.core.registration import register

from .launcher import Child, Launcher, plan

HEARTBEAT_S = 2.0
REGISTRATION_TTL_S = 10.0
DEFAULT_MAX_ONGOING_REQUESTS = 256  # our servers are async with their own pools: Serve's default of 5 starves them
REPLICA_PREFIX = "SERVE_REPLICA::"
DRAIN_S = 30.0


@dataclass
class ServerDeployment:
    """One server of the stack and what Serve needs to run it."""

    name: str
    kind: str
    spec: ServerSpec
    options: dict[str, Any]
    url: str = ""
    replicas: dict[str, Any] = field(default_factory=dict)

    @property
    def server_type(self) -> str:
        return server_type_name(self.kind)

    def deployment_options(self) -> dict[str, Any]:
        """Ray Serve `@serve.deployment` options from the stack entry's scaling fields."""
        spec = self.spec
        actor: dict[str, Any] = {"num_cpus": spec.num_cpus, "num_gpus": spec.num_gpus}
        out: dict[str, Any] = {
            "name": self.name,
            "ray_actor_options": actor,
            "max_ongoing_requests": spec.max_ongoing_requests or DEFAULT_MAX_ONGOING_REQUESTS,
            "health_check_period_s": 2.0,
            # a resource replica that scales down first serves its open sessions that cannot move (DRAIN_S)
            "graceful_shutdown_timeout_s": DRAIN_S + 5.0 if self.kind.startswith("resources/") else 5.0,
        }
        if spec.autoscaling is not None:
            out["autoscaling_config"] = spec.autoscaling.model_dump()
        else:
            out["num_replicas"] = spec.replicas
        return out


def plan_deployments(stack: Stack, *, where: str = "stack") -> tuple[Child, list[ServerDeployment]]:
    """Validate the stack exactly as the process backend does; the head runs as a child process."""
    children = plan(stack, where=where)
    deployments = []
    for name, spec in stack.servers.items():
        # `${VAR}` resolved here: a replica on another node does not have this environment
        options = interpolate(spec.options, where=f"{where}: servers.{name}")
        deployments.append(ServerDeployment(name, spec.kind, spec, options))
    return children[0], deployments


def replica_secrets() -> dict[str, str]:
    """What a replica needs from our environment that is secret: the bearer key."""
    key = api_key()
    return {"GYMSERVE_API_KEY": key} if key else {}


def _gym_server_class() -> type:
    """The Serve deployment class (built on demand: Ray is an optional dependency)."""
    from ray import serve

    @serve.ingress()
    class GymServer:
        def __init__(self, kind: str, name: str, options: dict[str, Any], head_url: str,
                     secrets: dict[str, str], env: dict[str, str] | None = None) -> None:
            self.kind, self.name, self.options, self.head_url = kind, name, options, head_url
            # the key travels as a bound argument, not in the runtime_env (shown in Ray's dashboard
            # and state API): replicas on other nodes do not see our environment
            os.environ.update(secrets)
            os.environ.update(env or {})
            if env and SESSION_STORE_ENV in env:
                import ray

                # a port of this replica's own on its node's address: agents call a session's owner directly
                os.environ.setdefault("GYMSERVE_DIRECT_HOST", ray.util.get_node_ip_address())

        def __serve_build_asgi_app__(self) -> Any:
            from gymserve.commands.serve import load_config
            from services.core.serving import tune_gc

            spec = {**self.options, "head_url": self.head_url, "register_with_head": False}
            module, config = load_config(self.kind, [], name=self.name, spec=spec)
            app = module.build(config)
            tune_gc()
            return app

    return GymServer


@contextlib.contextmanager
def _dynamic_agent_port() -> Iterator[None]:
    """`ray.init` has no option for the dashboard agent's HTTP port and defaults to a fixed one
    (52365); 0 lets the OS choose, so several local Rays can run side by side."""
    from ray._private import parameter

    original = parameter.RayParams.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("dashboard_agent_listen_port", 0)
        original(self, *args, **kwargs)

    parameter.RayParams.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        parameter.RayParams.__init__ = original  # type: ignore[method-assign]


class RayCluster:
    """Our handle on Ray and Serve: start or join, deploy, observe, shut down what we started."""

    def __init__(self, *, address: str | None, serve_host: str, serve_port: int, num_cpus: float | None,
                 temp_dir: str | None, dashboard: bool) -> None:
        self.address = address
        self.serve_host = serve_host
        self.serve_port = serve_port or free_port(connect_host(serve_host) if serve_host != "::" else "127.0.0.1")
        self.num_cpus = num_cpus
        self.temp_dir = temp_dir
        self.dashboard = dashboard
        self.started_ray = False
        self.started_serve = False
        self.apps: list[str] = []
        # session journals and the replica registry of stateful servers: a folder every replica can read
        # (one machine: a temporary folder removed at shutdown; several nodes: a shared GYMSERVE_SESSION_STORE)
        self.session_store = os.environ.get(SESSION_STORE_ENV) or ""
        self.own_store = False

    def connect(self) -> None:
        import ray
        from ray import serve

        kwargs: dict[str, Any] = {"include_dashboard": self.dashboard, "log_to_driver": False,
                                  "configure_logging": False, "namespace": "gymserve"}
        if self.address:
            ray.init(address=self.address, **kwargs)
        else:
            if self.temp_dir:
                kwargs["_temp_dir"] = os.path.abspath(self.temp_dir)
            # a local Ray listens on loopback only: its GCS and dashboard run code for anyone who reaches them
            kwargs["_node_ip_address"] = os.environ.get("GYMSERVE_RAY_NODE_IP", "127.0.0.1")
            if self.num_cpus is not None:
                kwargs["num_cpus"] = int(self.num_cpus)
            # replicas are our servers, not background batch work: run them at normal priority
            # (Ray nices its workers to 15); Prometheus export of Ray's own metrics is off, which
            # spares its agent a core's share per busy node (Serve's autoscaling does not use it)
            kwargs["_system_config"] = {"worker_niceness": 0, "enable_metrics_collection": False}
            self._start_local_ray(kwargs)
            self.started_ray = True
        try:
            serve.context._get_global_client()  # raises when no Serve runs on this cluster
        except Exception:
            serve.start(http_options={"host": self.serve_host, "port": self.serve_port,
                                      "location": "HeadOnly" if not self.address else "EveryNode"})
            self.started_serve = True
        else:
            self.serve_port = int(serve.context._get_global_client().http_config.port)

    @staticmethod
    def _start_local_ray(kwargs: dict[str, Any], attempts: int = 3) -> None:
        """`ray.init` gives its raylet a fixed 30 s to register, which a loaded machine can miss:
        clear away the half-started node and try again."""
        import ray

        for attempt in range(1, attempts + 1):
            try:
                with _dynamic_agent_port():
                    ray.init(**{**kwargs, "_metrics_export_port": free_port()})
                return
            except Exception as exc:
                if "timed out during startup" not in str(exc) or attempt == attempts:
                    raise
                with contextlib.suppress(Exception):
                    ray.shutdown()
                _kill_own_session()

    def deploy(self, deployments: list[ServerDeployment], head_url: str) -> None:
        from ray import serve
        from ray.serve.api import RunTarget

        cls = _gym_server_class()
        targets = []
        if not self.session_store:
            self.session_store = tempfile.mkdtemp(prefix="gymserve-sessions-")
            self.own_store = True
        for dep in deployments:
            env = {SESSION_STORE_ENV: self.session_store} if dep.kind.startswith(("resources/", "agents/")) else {}
            if dep.kind.startswith("resources/"):
                env["GYMSERVE_DRAIN_S"] = str(DRAIN_S)
            app = serve.deployment(cls, **dep.deployment_options()).bind(dep.kind, dep.name, dep.options, head_url,
                                                                         replica_secrets(), env)
            targets.append(RunTarget(target=app, name=dep.name, route_prefix=f"/{dep.name}"))
        serve.run_many(targets, wait_for_ingress_deployment_creation=False, wait_for_applications_running=False)
        self.apps = [d.name for d in deployments]

    def observe(self, deployments: list[ServerDeployment]) -> dict[str, str]:
        """Refresh each deployment's `replicas` view; returns {app: status} (RUNNING, DEPLOYING, DEPLOY_FAILED...)."""
        from ray import serve
        from ray._private import state

        status = serve.status().applications
        actors = [a for a in state.actors().values() if str(a.get("Name") or "").startswith(REPLICA_PREFIX)]
        out = {}
        for dep in deployments:
            app = status.get(dep.name)
            out[dep.name] = app.status.value if app else "NOT_STARTED"
            deployment = app.deployments.get(dep.name) if app else None
            mine = [a for a in actors if a["Name"].startswith(f"{REPLICA_PREFIX}{dep.name}#{dep.name}#")]
            alive = [a for a in mine if a.get("State") == "ALIVE"]
            died = [a for a in mine if a.get("State") == "DEAD" and _died_unexpectedly(a)]
            dep.replicas = {
                "running": int(deployment.replica_states.get("RUNNING", 0)) if deployment else 0,
                "states": {str(k): int(v) for k, v in (deployment.replica_states.items() if deployment else [])},
                "status": deployment.status.value if deployment else out[dep.name],
                "restarts": len(died),
                "pids": sorted(int(a["Pid"]) for a in alive if a.get("Pid")),
                "message": (app.message if app else "")[:500] or (deployment.message if deployment else "")[:500],
            }
        return out

    def shutdown(self) -> None:
        import ray
        from ray import serve

        try:
            if not ray.is_initialized():
                return
            with contextlib.suppress(Exception):
                if self.started_serve:
                    serve.shutdown()
                else:  # a Serve someone else runs on the cluster keeps its other applications
                    for name in self.apps:
                        serve.delete(name, _blocking=True)
            ray.shutdown()
        finally:
            if self.own_store:
                shutil.rmtree(self.session_store, ignore_errors=True)


def _kill_own_session() -> None:
    """SIGKILL the daemons of a local Ray this process started (its session folder's name ends
    with our pid), e.g. those of a start-up that timed out."""
    session = re.compile(rf"session_[^/\s]*_{os.getpid()}(?:[/\s]|$)")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if session.search(cmdline):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


def _died_unexpectedly(actor: dict[str, Any]) -> bool:
    """A replica whose process died or was killed (not one Serve stopped on purpose when scaling down)."""
    cause = str(actor.get("DeathCause") or "")  # a protobuf message; its text names the reason
    return any(reason in cause for reason in ("WORKER_DIED", "NODE_DIED", "OUT_OF_MEMORY"))


class RayLauncher(Launcher):
    """The head as a supervised child process, every other server as a Serve deployment."""

    def __init__(self, head: Child, deployments: list[ServerDeployment], cluster: RayCluster, *,
                 ready_timeout_s: float = 600.0, restart: bool = True, out: TextIO | None = None) -> None:
        super().__init__([head], ready_timeout_s=ready_timeout_s, restart=restart, out=out)
        self.head = head
        self.deployments = deployments
        self.cluster = cluster
        self.total = len(deployments) + 1

    def _proxy_host(self) -> str:
        host = self.cluster.serve_host
        if host in ANY_ADDRESSES:
            import ray

            return ray.util.get_node_ip_address()
        return host

    def _head_url_for_replicas(self) -> str:
        host = self.head.host
        if host in ANY_ADDRESSES:
            import ray

            host = ray.util.get_node_ip_address()
        return f"http://{host}:{self.head.port}"

    def _registration(self, dep: ServerDeployment) -> dict[str, Any]:
        host = self._proxy_host()
        return {"name": dep.name, "server_type": dep.server_type, "kind": dep.kind, "host": host,
                "port": self.cluster.serve_port, "url": dep.url, "pid": None, "ttl_s": REGISTRATION_TTL_S,
                "backend": "ray", "replicas": dep.replicas}

    async def _register_all(self) -> None:
        await asyncio.gather(*(register(self.head.url, self._registration(d)) for d in self.deployments),
                             return_exceptions=True)

    async def _heartbeat(self) -> None:
        """Replica state to the head, forever: the head's health view shows restarts and scaling."""
        while True:
            try:
                await asyncio.to_thread(self.cluster.observe, self.deployments)
                await self._register_all()
            except Exception as exc:  # Ray busy or the head restarting: try again next beat
                self.say(f"could not refresh replica state: {type(exc).__name__}: {exc}")
            await asyncio.sleep(HEARTBEAT_S)

    async def _wait_deployments_ready(self) -> str | None:
        assert self._stop is not None
        deadline = time.monotonic() + self.ready_timeout_s
        pending = {d.name: d for d in self.deployments}
        async with httpx.AsyncClient(trust_env=False, headers=auth_headers()) as client:
            while pending:
                statuses = await asyncio.to_thread(self.cluster.observe, self.deployments)
                for name, status in statuses.items():
                    dep = pending.get(name)
                    if dep is not None and status == "DEPLOY_FAILED":
                        return f"server {name!r} ({dep.kind}) failed to deploy: {dep.replicas.get('message')}"
                running = [d for d in pending.values() if statuses.get(d.name) == "RUNNING"]
                probes = await asyncio.gather(*(self._ready(client, d) for d in running))
                for dep, ok in zip(running, probes):
                    if ok:
                        pending.pop(dep.name)
                if not pending:
                    return None
                if time.monotonic() > deadline:
                    return "\n".join(f"server {d.name!r} ({d.kind}) was not ready after {self.ready_timeout_s:g}s "
                                     f"(status {statuses.get(d.name)}): {d.replicas.get('message')}"
                                     for d in pending.values())
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 0.5)
                if self._stop.is_set():
                    return "stopped before every server was ready"
        return None

    @staticmethod
    async def _ready(client: httpx.AsyncClient, dep: ServerDeployment) -> bool:
        try:
            return (await client.get(f"{dep.url}/ready", timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    def print_table(self) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(show_lines=False)
        for column in ("name", "type", "kind", "url", "replicas"):
            table.add_column(column)
        table.add_row(self.head.name, self.head.server_type, "head", self.head.url, f"pid {self.head.pid}")
        for dep in self.deployments:
            table.add_row(dep.name, dep.server_type, dep.kind, dep.url, str(dep.replicas.get("running", "")))
        with contextlib.suppress(OSError, ValueError):
            Console(file=self.out, width=None if self.out.isatty() else 240, force_terminal=self.color,
                    no_color=not self.color).print(table)
            self.out.flush()

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)

    async def run(self) -> int:
        """Run until SIGINT/SIGTERM; 0 on a clean stop, 1 if the stack could not start."""
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._install_signals()
        heartbeat: asyncio.Task[None] | None = None
        supervisors: list[asyncio.Task[None]] = []
        try:
            where = f"joining Ray at {self.cluster.address}" if self.cluster.address else "starting a local Ray"
            self.say(f"starting {self.total} servers ({len(self.deployments)} as Ray Serve deployments, {where}); "
                     f"head on {self.head.url}")
            await self._spawn(self.head)
            try:
                await asyncio.to_thread(self.cluster.connect)
            except Exception as exc:
                self.say(f"start-up failed: cannot start Ray or Serve: {type(exc).__name__}: {exc}")
                return 1
            self._install_signals()  # ray.init may have replaced them
            if self._stop.is_set():
                return 0
            proxy = f"http://{self._proxy_host()}:{self.cluster.serve_port}"
            for dep in self.deployments:
                dep.url = f"{proxy}/{dep.name}"
            error = await self._wait_all_ready()  # the head
            if error is None:
                await asyncio.to_thread(self.cluster.deploy, self.deployments, self._head_url_for_replicas())
                error = await self._wait_deployments_ready()
            if error is not None:
                return self._start_failed(error)
            await self._register_all()
            heartbeat = asyncio.create_task(self._heartbeat())
            self.say(f"all {self.total} servers ready")
            self.print_table()
            self.say(f"head: {self.head.url}  dashboard: {self.head.url}/dashboard  Serve proxy: {proxy}  "
                     f"(Ctrl-C stops every server)")
            supervisors = [asyncio.create_task(self._supervise(self.head))]
            await self._stop.wait()
            self.say(f"received {signal.Signals(self._signal).name if self._signal else 'stop'}; "
                     f"stopping {self.total} servers")
            return 0
        finally:
            self._stopping = True
            for task in [heartbeat, *supervisors]:
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in [heartbeat, *supervisors] if t), return_exceptions=True)
            await asyncio.to_thread(self.cluster.shutdown)
            await self.stop_all()
            with contextlib.suppress(Exception):
                await shared_client().aclose()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            self.say("all servers stopped" + (" and Ray shut down" if self.cluster.started_ray else ""))


def check_available() -> None:
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"--backend ray needs Ray Serve: pip install 'gymserve[ray]' ({exc})") from None
