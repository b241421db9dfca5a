"""Deployment files are validated, not run (no Docker engine here): every server they start must be
a real kind whose options validate, so a typo fails here instead of on a cluster."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from services.core.config import apply_overrides, build_server_config
from services.core.loader import load_server

ROOT = Path(__file__).resolve().parents[2]


def _serve_commands(args: list[str]) -> tuple[str, list[str]]:
    assert args[0] == "serve", args
    kind = args[1]
    overrides = [a for a in args[2:] if "=" in a and not a.startswith("-")]
    return kind, overrides


def _check(kind: str, overrides: list[str]) -> None:
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
        _check(*_serve_commands(command))
        checked += 1
    assert checked >= 1


def test_compose_agents_point_at_servers_of_the_stack():
    services = _compose(ROOT / "docker-compose.yml")["services"]
    names = {s["command"][s["command"].index("--name") + 1] for s in services.values()}
    assert {"head", "policy_model"} <= names
    for service in services.values():
        for arg in service["command"]:
            if arg.startswith(("resources_server=", "model_server=")):
                assert arg.split("=", 1)[1] in names, arg
        env = service.get("environment", {})
        if service["command"][1] != "head":
            assert env.get("GYMSERVE_HEAD_URL") == "http://head:11000"


def test_kubernetes_manifest_servers_validate():
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/k8s/gymserve.yaml").read_text()) if d]
    deployments = [d for d in docs if d["kind"] == "Deployment"]
    assert deployments
    for dep in deployments:
        for container in dep["spec"]["template"]["spec"]["containers"]:
            _check(*_serve_commands(container["args"]))


def test_slurm_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(ROOT / "deploy/slurm/gymserve.sbatch")], check=True)
