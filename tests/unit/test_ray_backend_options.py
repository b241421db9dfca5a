"""Stack scaling fields (replicas, num_cpus, num_gpus, max_ongoing_requests, autoscaling): parsed
once, turned into Ray Serve deployment options by the Ray backend, invisible to the process backend.
No Ray is started here (the backend's integration test does that)."""
from __future__ import annotations

import json

import pytest

from gymserve.launcher import plan
from gymserve.ray_backend import DEFAULT_MAX_ONGOING_REQUESTS, plan_deployments, replica_secrets
from services.core.middleware.paths import route_path
from services.core.config import ConfigError, load_stack

STACK = {
    "head": {"port": 0},
    "servers": {
        "math": {"kind": "resources/math", "workers": 1, "replicas": 3, "num_cpus": 2, "max_ongoing_requests": 64},
        "rm": {"kind": "resources/exact_match", "num_gpus": 0.5,
               "autoscaling": {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8}},
        "plain": {"kind": "resources/exact_match", "options": {"case_sensitive": True}},
    },
}


def _stack(**overrides):
    data = json.loads(json.dumps(STACK))
    for name, extra in overrides.items():
        data["servers"][name].update(extra)
    return load_stack(base=data)


def test_scaling_fields_are_parsed_and_kept_out_of_server_options():
    stack = _stack()
    math = stack.servers["math"]
    assert (math.replicas, math.num_cpus, math.max_ongoing_requests) == (3, 2.0, 64)
    assert math.options == {"workers": 1}
    assert stack.servers["rm"].autoscaling.max_replicas == 4 and stack.servers["rm"].num_gpus == 0.5
    assert stack.servers["plain"].replicas == 1 and stack.servers["plain"].autoscaling is None


def test_process_backend_children_never_see_the_scaling_fields():
    children = {c.name: c for c in plan(_stack())}
    assert json.loads(children["math"].env["GYMSERVE_SERVER_SPEC"]) == {"workers": 1}
    assert json.loads(children["plain"].env["GYMSERVE_SERVER_SPEC"]) == {"case_sensitive": True}
    # the head gets the stack back and re-validates it: the fields survive the round trip
    head_stack = load_stack(base=json.loads(children["head"].env["GYMSERVE_SERVER_SPEC"])["stack"])
    assert head_stack.servers["math"].replicas == 3 and head_stack.servers["math"].options == {"workers": 1}


def test_deployment_options_from_a_stack_entry(monkeypatch):
    monkeypatch.delenv("GYMSERVE_API_KEY", raising=False)
    head, deployments = plan_deployments(_stack())
    assert head.name == "head"
    opts = {d.name: d.deployment_options() for d in deployments}
    assert opts["math"]["num_replicas"] == 3 and "autoscaling_config" not in opts["math"]
    assert opts["math"]["ray_actor_options"] == {"num_cpus": 2.0, "num_gpus": 0.0}
    assert opts["math"]["max_ongoing_requests"] == 64
    rm = opts["rm"]
    assert "num_replicas" not in rm and rm["ray_actor_options"]["num_gpus"] == 0.5
    assert rm["autoscaling_config"]["min_replicas"] == 1 and rm["autoscaling_config"]["max_replicas"] == 4
    assert rm["autoscaling_config"]["target_ongoing_requests"] == 8
    assert opts["plain"]["max_ongoing_requests"] == DEFAULT_MAX_ONGOING_REQUESTS
    assert {d.name: d.options for d in deployments}["plain"] == {"case_sensitive": True}


def test_api_key_reaches_replicas_as_a_bound_argument_not_the_runtime_env(monkeypatch):
    monkeypatch.setenv("GYMSERVE_API_KEY", "s3cret")
    _, deployments = plan_deployments(_stack())
    opts = deployments[0].deployment_options()
    assert "s3cret" not in json.dumps(opts) and "runtime_env" not in opts["ray_actor_options"]
    assert "s3cret" not in json.dumps(deployments[0].options)
    assert replica_secrets() == {"GYMSERVE_API_KEY": "s3cret"}  # bound into each replica's constructor


def test_env_references_are_resolved_before_shipping_to_replicas(monkeypatch):
    monkeypatch.setenv("GS_TEST_ANSWER", "yes")
    _, deployments = plan_deployments(_stack(plain={"note": "${GS_TEST_ANSWER}"}))
    assert {d.name: d.options for d in deployments}["plain"]["note"] == "yes"


@pytest.mark.parametrize("entry, field", [
    ({"replicas": 0}, "replicas"),
    ({"num_gpus": -1}, "num_gpus"),
    ({"max_ongoing_requests": 0}, "max_ongoing_requests"),
    ({"autoscaling": {"min_replicas": 3, "max_replicas": 2}}, "autoscaling"),
    ({"autoscaling": {"max_replicas": 2, "bogus": 1}}, "autoscaling.bogus"),
])
def test_bad_scaling_fields_are_config_errors_naming_the_field(entry, field):
    with pytest.raises(ConfigError) as err:
        _stack(math=entry)
    assert f"servers.math.{field}" in str(err.value)


@pytest.mark.parametrize("path, root, expected", [
    ("/health", "", "/health"),
    ("/math/health", "/math", "/health"),
    ("/math", "/math", "/"),
    ("/other/x", "/math", "/other/x"),
])
def test_route_path_below_a_route_prefix(path, root, expected):
    assert route_path({"path": path, "root_path": root}) == expected
