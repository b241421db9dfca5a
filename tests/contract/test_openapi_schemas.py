"""Every server kind's OpenAPI schema, built in-process (no server started, no model or pool loaded):
typed request and reply bodies, documented error replies, the failure vocabulary."""
from __future__ import annotations

import re

import pytest

from services.core.failures import FAILURE_KINDS, FailureKind
from services.core.loader import available_kinds, load_server

NAME = re.compile(r"^[a-zA-Z0-9.\-_]+$")
# Options a kind needs before it can be built (nothing is contacted or loaded at build time).
REQUIRED = {
    "resources/reward_model": {"model_name": "unused"},
    "resources/equivalence_llm_judge": {"judge_model_server": "http://127.0.0.1:9"},
    "resources/llm_judge": {"judge_model_server": "http://127.0.0.1:9"},
    "resources/genrm_compare": {"judge_model_server": "http://127.0.0.1:9"},
    "models/openai_proxy": {"base_url": "http://127.0.0.1:9/v1"},
    "agents/simple_agent": {"resources_url": "http://127.0.0.1:9", "model_url": "http://127.0.0.1:9"},
    "agents/multi_turn_agent": {"resources_url": "http://127.0.0.1:9", "model_url": "http://127.0.0.1:9"},
}


def openapi_of(kind: str) -> dict:
    module = load_server(kind)
    return module.build(module.Config(name="schema", **REQUIRED.get(kind, {}))).openapi()


@pytest.fixture(scope="module", params=["head", *available_kinds()])
def schema(request):
    return request.param, openapi_of(request.param)


def test_every_operation_is_typed_and_documents_its_errors(schema):
    kind, spec = schema
    components = spec["components"]["schemas"]
    assert all(NAME.match(name) for name in components), sorted(components)
    for path, operations in spec["paths"].items():
        for method, op in operations.items():
            where = f"{kind} {method.upper()} {path}"
            ok = op["responses"]["200"]
            assert ok.get("content"), f"{where}: no 200 reply schema"
            if method == "post":
                assert "requestBody" in op, f"{where}: no request body schema"
                assert {"400", "401", "413"} <= set(op["responses"]), f"{where}: {sorted(op['responses'])}"
                error = op["responses"]["400"]["content"]["application/json"]["schema"]
                assert error == {"$ref": "#/components/schemas/ErrorReply"}, where
    refs = set(re.findall(r'"#/components/schemas/([^"]+)"', str(spec).replace("'", '"')))
    assert refs <= set(components), f"{kind}: dangling refs {refs - set(components)}"


def test_resource_servers_type_verify_and_its_failure_kinds():
    for kind in [k for k in available_kinds() if k.startswith("resources/")]:
        spec = openapi_of(kind)
        verify = spec["paths"]["/verify"]["post"]
        body_ref = verify["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        reply_ref = verify["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        components = spec["components"]["schemas"]
        body, reply = components[body_ref], components[reply_ref]
        assert {"responses_create_params", "response"} <= set(body["properties"]), kind
        assert body.get("additionalProperties") is True, f"{kind}: row fields must be kept and echoed"
        assert {"reward", "reward_components", "mask_sample", "failure_kind", "failure_reason"} <= set(
            reply["properties"]), kind
        assert components["FailureKind"]["enum"] == list(FAILURE_KINDS), kind
        for status in ("409", "503"):
            assert status in spec["paths"]["/seed_session"]["post"]["responses"], kind


def test_environment_row_fields_are_typed():
    spec = openapi_of("resources/exact_match")
    body = spec["components"]["schemas"]["ExactMatchRequest"]
    assert body["properties"]["expected_answer"]["type"] == "string"
    assert "expected_answer" in body["required"]
    example = spec["paths"]["/verify"]["post"]["requestBody"]["content"]["application/json"]["examples"]["example"]
    assert example["value"]["expected_answer"] == "Paris"


def test_failure_kind_is_the_plain_string_on_the_wire():
    import json

    assert json.dumps({"k": FailureKind.TIMEOUT}) == '{"k": "timeout"}'
    assert f"{FailureKind.SANDBOX}" == "sandbox" and str(FailureKind.BAD_REQUEST) == "bad_request"
    assert FAILURE_KINDS == ("timeout", "crash", "bad_request", "upstream", "sandbox", "context_overflow",
                             "session_lost", "session_diverged")
