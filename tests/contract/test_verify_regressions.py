"""Regressions of `/verify` on every environment (real servers):

- re-verifying a collected rollout (the reply of an earlier verify, `reward` and all) answers
  200 with the same verdict, never a 500 from a duplicated `reward` keyword;
- a stale verdict in the request (masked, a failure kind, components, a non-numeric reward)
  is replaced, never echoed;
- a lone surrogate escape anywhere in the body is a 400 naming the field.
"""
from __future__ import annotations

import jsonschema
import pytest

from .servers import ENVIRONMENTS, examples, verify_body_for

ENVS = sorted(ENVIRONMENTS)


def stable(value):
    """`value` without measured run times (code's `time_s`), which differ between two runs."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k != "time_s"}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


@pytest.mark.parametrize("env", ENVS)
def test_reverify_of_a_reply_gives_the_same_reply(env_servers, env):
    server = env_servers[env]
    for row in examples(env):
        first = server.post("/verify", json=verify_body_for(env, row))
        assert first.status_code == 200, first.text
        reply = first.json()
        assert reply["mask_sample"] is False, reply
        again = server.post("/verify", json=reply)
        assert again.status_code == 200, again.text
        assert stable(again.json()) == stable(reply)


@pytest.mark.parametrize("env", ENVS)
def test_stale_verdict_in_the_request_is_replaced(env_servers, env):
    server = env_servers[env]
    row = examples(env)[0]
    fresh = server.post("/verify", json=verify_body_for(env, row)).json()
    stale = {**verify_body_for(env, row), "reward": "not a number", "mask_sample": True, "failure_kind": "crash",
             "failure_reason": "old", "reward_components": {"old": 5.0}}
    reply = server.post("/verify", json=stale)
    assert reply.status_code == 200, reply.text
    out = reply.json()
    assert out["reward"] == fresh["reward"] and out["mask_sample"] is False
    assert "failure_kind" not in out and "failure_reason" not in out
    assert out.get("reward_components") == fresh.get("reward_components")


@pytest.mark.parametrize("env", ENVS)
def test_batch_reverify_matches_single(env_servers, env):
    server = env_servers[env]
    replies = [server.post("/verify", json=verify_body_for(env, row)).json() for row in examples(env)[:3]]
    again = server.post("/verify/batch", json=replies)
    assert again.status_code == 200, again.text
    assert [r["reward"] for r in again.json()] == [r["reward"] for r in replies]
    assert not any(r["mask_sample"] for r in again.json())


@pytest.mark.parametrize("env", ENVS)
def test_lone_surrogate_is_a_400_naming_the_field(env_servers, env):
    server = env_servers[env]
    body = verify_body_for(env, examples(env)[0])
    body["response"]["output"][0]["id"] = "\ud800"
    raw = __import__("json").dumps(body)  # ensure_ascii: the escape travels as \\ud800
    reply = server.post("/verify", content=raw, headers={"content-type": "application/json"})
    assert reply.status_code == 400, reply.text
    assert "response.output[0].id" in reply.json()["detail"]


def _reply_schema(server) -> tuple[dict, dict, dict]:
    """(the /verify reply schema, its declared properties, the request's declared properties)."""
    spec = server.get("/openapi.json").json()
    post = spec["paths"]["/verify"]["post"]
    reply_ref = post["responses"]["200"]["content"]["application/json"]["schema"]
    request_ref = post["requestBody"]["content"]["application/json"]["schema"]
    schemas = spec["components"]["schemas"]
    return ({**reply_ref, "components": spec["components"]},
            schemas[reply_ref["$ref"].rsplit("/", 1)[-1]]["properties"],
            schemas[request_ref["$ref"].rsplit("/", 1)[-1]]["properties"])


MISTYPED = [{}, {"x": False}]


@pytest.mark.parametrize("env", ENVS)
def test_a_malformed_batch_item_still_matches_the_reply_schema(env_servers, env):
    """An item that fails parsing is echoed back as a masked bad_request; the echo must not carry
    its own mistyped values of fields the environment's reply declares (schemathesis found
    reasoning_gym echoing `task_name: [..]` into a reply whose schema says string)."""
    server = env_servers[env]
    reply_schema, declared, _ = _reply_schema(server)
    item = {name: MISTYPED for name in declared}
    item["response"] = 5  # fails parsing: the whole item is a bad_request
    reply = server.post("/verify/batch", json=[item])
    assert reply.status_code == 200, reply.text
    [out] = reply.json()
    assert out["mask_sample"] is True and out["failure_kind"] == "bad_request", out
    jsonschema.validate(out, reply_schema)


@pytest.mark.parametrize("env", ENVS)
def test_extra_request_fields_never_break_the_reply_schema(env_servers, env):
    """A valid row may carry any extra field, and extras are echoed; one named like a field only the
    reply declares (a verdict detail such as `extracted_answer`) but holding another type must not
    come back in the reply, whichever way the environment built it (scored or failed)."""
    server = env_servers[env]
    reply_schema, declared, request_fields = _reply_schema(server)
    extras = {name: MISTYPED for name in declared if name not in request_fields}
    body = {**verify_body_for(env, examples(env)[0]), **extras}
    for path, payload in (("/verify", body), ("/verify/batch", [body])):
        reply = server.post(path, json=payload)
        assert reply.status_code == 200, reply.text
        out = reply.json() if path == "/verify" else reply.json()[0]
        jsonschema.validate(out, reply_schema)
