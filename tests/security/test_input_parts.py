"""Typed Responses objects on every environment (real servers): a wrong type anywhere inside `response.output`
or the input messages is a 400 naming the path, never a 500; and a hypothesis fuzz that mutates the nested
Responses objects at every depth (not only top-level fields) gets no 5xx and a reply valid against the
environment's own `/verify` reply schema."""
from __future__ import annotations

import copy
import json
from typing import Any, Iterator

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from gymserve.testing import ServerProcess
from tests.contract.servers import ENVIRONMENTS, examples, running_environments, verify_body_for

ENVS = sorted(ENVIRONMENTS)


@pytest.fixture(scope="module")
def env_servers() -> Iterator[dict[str, ServerProcess]]:
    with running_environments("parts") as servers:
        yield servers


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60.0) as c:
        yield c


def rich_body(env: str) -> dict[str, Any]:
    """The environment's example row with Responses objects that hold every kind of nesting: text parts, a
    refusal, a reasoning summary, a function call and its output, in the input and in the output."""
    body = copy.deepcopy(verify_body_for(env, examples(env)[0]))
    params = body["responses_create_params"]
    if isinstance(params.get("input"), str):
        params["input"] = [{"role": "user", "content": params["input"]}]
    params["input"] = list(params["input"]) + [
        {"role": "user", "content": [{"type": "input_text", "text": "and?"}]},
        {"type": "function_call_output", "call_id": "call_x", "output": "{}"}]
    body["response"]["output"] = [
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}]},
        *body["response"]["output"],
        {"type": "message", "role": "assistant", "id": "msg_2", "status": "completed",
         "content": [{"type": "output_text", "text": "", "annotations": []}, {"type": "refusal", "refusal": ""}]}]
    return body


# Where a wrong type goes, and the path the 400 must name.
PLACEMENTS = [
    (("response", "output", -1, "content", 0, "type"), {"a": 1}, "content[0].type"),
    (("response", "output", -1, "content", 0, "text"), {"a": 1}, "content[0].text"),
    (("response", "output", -1, "content", 1, "refusal"), ["x"], "content[1].refusal"),
    (("response", "output", -1, "content", 0, "annotations"), {"a": 1}, "content[0].annotations"),
    (("response", "output", -1, "content", 0), 5, "content[0]"),
    (("response", "output", 0, "summary", 0, "text"), {"a": 1}, "summary[0].text"),
    (("responses_create_params", "input", -2, "content", 0, "type"), {"a": 1}, "content[0].type"),
    (("responses_create_params", "input", -2, "content", 0, "text"), [1], "content[0].text"),
    (("responses_create_params", "input", -2, "content"), {"text": "x"}, ".content"),
    (("responses_create_params", "input", -2, "role"), {"a": 1}, ".role"),
    (("responses_create_params", "input", -1, "call_id"), {"a": 1}, ".call_id"),
]


def place(body: dict[str, Any], path: tuple, value: Any) -> dict[str, Any]:
    node: Any = body
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return body


@pytest.mark.parametrize("env", ENVS)
def test_wrong_type_in_a_content_part_is_400_naming_it(env_servers, client, env):
    url = env_servers[env].url
    assert client.post(f"{url}/verify", json=rich_body(env)).status_code == 200
    for path, value, named in PLACEMENTS:
        body = place(rich_body(env), path, value)
        reply = client.post(f"{url}/verify", json=body)
        assert reply.status_code == 400, (path, reply.status_code, reply.text)
        assert named in reply.json()["detail"], (path, reply.json()["detail"])
    # in a batch the bad item fails alone, as a masked bad_request
    bad = place(rich_body(env), PLACEMENTS[0][0], PLACEMENTS[0][1])
    items = client.post(f"{url}/verify/batch", json=[rich_body(env), bad]).json()
    assert items[0]["mask_sample"] is False
    assert items[1]["mask_sample"] is True and items[1]["failure_kind"] == "bad_request"
    assert "content[0].type" in items[1]["failure_reason"]


# ---------------------------------------------------------------------------------------------- fuzz
REPLACEMENTS: list[Any] = [None, True, 0, -1, 2.5, "", "x", "\u0000", [], {}, ["x"], [None], [{}],
                           {"type": {}}, {"type": "output_text", "text": {}}, [{"type": ["x"], "text": 1}],
                           {"role": 1, "content": [{"type": "input_text", "text": {"a": []}}]},
                           [[[[{"text": {"text": {"text": None}}}]]]]]


def nested_paths(value: Any, prefix: tuple) -> list[tuple]:
    """Every path below `prefix` into a JSON value (keys and list indexes), at every depth."""
    out = []
    if isinstance(value, dict):
        for key, item in value.items():
            out.append(prefix + (key,))
            out += nested_paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out.append(prefix + (i,))
            out += nested_paths(item, prefix + (i,))
    return out


@st.composite
def mutated(draw: st.DrawFn, env: str) -> dict[str, Any]:
    """The rich body with 1-3 mutations inside its Responses objects; the depth is drawn first, so deep
    paths (a part's field inside a message inside the output) are as likely as shallow ones."""
    body = rich_body(env)
    for _ in range(draw(st.integers(1, 3))):
        candidates = (nested_paths(body["response"], ("response",))
                      + nested_paths(body["responses_create_params"].get("input"), ("responses_create_params", "input")))
        if not candidates:
            break
        depths = sorted({len(p) for p in candidates})
        depth = draw(st.sampled_from(depths))
        path = draw(st.sampled_from([p for p in candidates if len(p) == depth]))
        parent: Any = body
        for step in path[:-1]:
            parent = parent[step]
        if draw(st.booleans()) and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(REPLACEMENTS)))
    return body


def reply_schema(client: httpx.Client, url: str) -> dict[str, Any]:
    spec = client.get(f"{url}/openapi.json").json()
    schema = spec["paths"]["/verify"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    return {**schema, "components": spec.get("components", {})}


@pytest.mark.parametrize("env", ENVS)
def test_fuzzed_responses_objects_never_500(env_servers, client, env):
    url = env_servers[env].url
    validator = jsonschema.Draft202012Validator(reply_schema(client, url))

    @settings(max_examples=25, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=mutated(env))
    def run(body: dict[str, Any]) -> None:
        reply = client.post(f"{url}/verify", content=json.dumps(body), headers={"content-type": "application/json"})
        assert reply.status_code < 500, reply.text
        out = reply.json()
        if reply.status_code >= 400:
            assert out["detail"] and out["error"]["type"] == "bad_request", out
            return
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(out)]
        assert not errors, errors[:5]
        assert "unexpected error" not in (out.get("failure_reason") or ""), out

    run()
