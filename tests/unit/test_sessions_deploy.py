"""The compose file and the Kubernetes manifests run a stateful environment on several replicas the way
`docs/sessions.md` says (no cluster runs here: the manifests are checked, their servers' options validated).

What a scaled stateful server needs: every replica mounts one shared folder for its session journals, the
replica registry and rollout checkpoints (and says where with GYMSERVE_SESSION_STORE), each replica can be
reached at an address of its own, and nothing pins a replica (a fixed container name or published port) so
the service can scale.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from services.core.config import apply_overrides, build_server_config
from services.core.loader import load_server
from services.resources.workplace.app import Workplace
from tests.unit.test_deploy_files import check_kind_options, serve_commands

ROOT = Path(__file__).resolve().parents[2]
STORE = "GYMSERVE_SESSION_STORE"


def _k8s(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy/k8s" / name).read_text()) if d]


def test_compose_stateful_services_share_a_session_folder_and_can_scale(monkeypatch):
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    volumes = {}
    for name in ("workplace", "workplace_simple_agent"):
        service = services[name]
        store = service["environment"][STORE]
        mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
        mount = next(m for m in mounts if store.startswith(m + "/"))
        volumes[name] = mounts[mount]
        assert "container_name" not in service and "ports" not in service, f"{name} cannot be scaled"
        kind, overrides = serve_commands(service["command"])
        check_kind_options(kind, overrides)
        monkeypatch.setenv(STORE, store)  # what the container's environment gives the server
        config = build_server_config(load_server(kind).Config, apply_overrides({"kind": kind, "name": name},
                                                                               overrides), where=name)
        assert store in (getattr(config, "session_store", None), getattr(config, "rollout_store", None))
    assert len(set(volumes.values())) == 1, "the replicas and their agent must share one volume"
    assert Workplace.rebuildable


def test_kubernetes_stateful_deployments_share_a_read_write_many_claim():
    docs = _k8s("stateful.yaml")
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}
    assert set(deployments) == {"gymserve-workplace", "gymserve-workplace-simple-agent"}
    for name, dep in deployments.items():
        assert dep["spec"]["replicas"] >= 2, name
        pod = dep["spec"]["template"]["spec"]
        claim = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]}
        for container in pod["containers"]:
            check_kind_options(*serve_commands(container["args"]))
            env = {e["name"]: e for e in container["env"]}
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            store = env[STORE]["value"]
            mount = next(m for m in mounts if store.startswith(m + "/"))
            assert "ReadWriteMany" in claims[claim[mounts[mount]]]["spec"]["accessModes"]
            assert env["GYMSERVE_ADVERTISE_HOST"]["value"] in services
            if container["args"][1].startswith("resources/"):
                # the pod's own IP: agents call the pod that holds a session, not the Service
                assert env["GYMSERVE_REPLICA_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    head = next(d for d in _k8s("gymserve.yaml") if d["kind"] == "Deployment" and d["metadata"]["name"] == "gymserve-head")
    allowed = next(e["value"] for e in head["spec"]["template"]["spec"]["containers"][0]["env"]
                   if e["name"] == "GYMSERVE_ALLOWED_HOSTS").split(",")
    assert services <= set(allowed), "the head must accept the stateful services' registrations"
