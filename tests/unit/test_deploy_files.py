"""Deployment files are validated without running them (tests/deploy runs the compose stack for real):
every server they start must be a real kind whose options validate, so a typo fails here instead of
on a cluster."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from services.core.config import apply_overrides, build_server_config
from services.core.loader import load_server

ROOT = Path(__file__).resolve().parents[2]


def serve_commands(args: list[str]) -> tuple[str, list[str]]:
    assert args[0] == "serve", args
    kind = args[1]
    overrides = [a for a in args[2:] if "=" in a and not a.startswith("-")]
    return kind, overrides


def check_kind_options(kind: str, overrides: list[str]) -> None:
    module = load_server(kind)
    values = apply_overrides({"kind": kind, "name": "x"}, overrides)
    build_server_config(module.Config, values, where=kind)


def _compose(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize("path", ["docker-compose.yml", "deploy/docker/compose.gpu.yml"])
def test_compose_servers_are_real_kinds_with_valid_options(path):
    services = _compose(ROOT / path)["services"]
    checked = 0
    for service in services.values():
        command = service.get("command")
        if not command or command[0] != "serve":
            continue
        check_kind_options(*serve_commands(command))
        checked += 1
    assert checked >= 1


def _running(services: dict) -> dict:
    """Services `up` starts (not the ones behind a profile, such as the one-shot collect)."""
    return {name: s for name, s in services.items() if not s.get("profiles")}


def test_compose_agents_point_at_servers_of_the_stack():
    services = _running(_compose(ROOT / "docker-compose.yml")["services"])
    serve = {name: s["command"] for name, s in services.items() if s["command"][0] == "serve"}
    names = {cmd[cmd.index("--name") + 1] for cmd in serve.values()}
    assert {"head", "policy_model"} <= names
    for name, command in serve.items():
        assert command[command.index("--name") + 1] == name  # instance name == service name (DNS)
        for arg in command:
            if arg.startswith(("resources_server=", "model_server=")):
                # reward_model runs `gymserve serve` from a shell entrypoint (it builds its model first)
                assert arg.split("=", 1)[1] in names | {"reward_model"}, arg
    for name, service in services.items():
        env = service.get("environment", {})
        if name != "head":
            assert env.get("GYMSERVE_HEAD_URL") == "http://head:11000"
            assert env.get("GYMSERVE_ADVERTISE_HOST") == name


def test_compose_runs_the_whole_default_stack_with_health_and_restarts():
    """Every server of the embedded default stack, plus the head and a reward model, each healthy-checked,
    restarted on crash, with the cache volume; only the head is published, on 127.0.0.1 by default."""
    services = _running(_compose(ROOT / "docker-compose.yml")["services"])
    default = yaml.safe_load((ROOT / "gymserve/stacks/default.yaml").read_text())["servers"]
    assert set(default) | {"head", "reward_model"} <= set(services), set(default) - set(services)
    for name, service in services.items():
        assert service["restart"] == "unless-stopped", name
        assert "/ready" in " ".join(service["healthcheck"]["test"]), name
        assert "cache:/cache" in service["volumes"], name
        assert ("ports" in service) == (name == "head"), name
    assert services["head"]["ports"] == ["${GYMSERVE_HEAD_BIND:-127.0.0.1}:${GYMSERVE_HEAD_PORT:-11000}:11000"]
    assert "serve resources/reward_model" in " ".join(services["reward_model"]["command"])


def test_env_example_names_every_variable_the_compose_file_reads():
    import re

    text = (ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"(?<!\$)\$\{([A-Z_][A-Z0-9_]*)", text)) - {"GYMSERVE_IMAGE"}  # $$ escapes the shell
    example = {line.split("=", 1)[0] for line in (ROOT / ".env.example").read_text().splitlines()
               if "=" in line and not line.startswith("#")}
    assert used <= example, used - example


def test_kubernetes_manifest_servers_validate():
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/k8s/gymserve.yaml").read_text()) if d]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert deployments
    for dep in deployments:
        for container in dep["spec"]["template"]["spec"]["containers"]:
            check_kind_options(*serve_commands(container["args"]))


def test_slurm_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(ROOT / "deploy/slurm/gymserve.sbatch")], check=True)
