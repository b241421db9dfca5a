"""Mutation fuzz of `/verify` on every environment (real servers, hypothesis, derandomized).

Valid bodies built from `datasets/<env>/example.jsonl` are mutated: a field dropped, a value
swapped for another JSON type (a list or object where a string was, a lone surrogate escape,
huge or negative numbers, ...). Whatever the mutation, the server answers a 4xx whose message
names a field, or a 200 verify reply; never a 5xx and never a reply masked as a verifier crash
(which would be a bug in the environment, not bad input).
"""
from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from .servers import ENVIRONMENTS, examples, verify_body_for

ENVS = sorted(ENVIRONMENTS)
REPLACEMENTS: list[Any] = [None, True, 0, -1, 1.5, -1e308, 10**30, "", "x", "\ud800", "a\udfffb", [], {},
                           ["x"], [1, "a"], {"type": ["x"]}, {"a": {}}, [{"type": {}}], "\u0000", "\U0001f600"]


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON value (keys and list indexes)."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            out += paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += paths(item, prefix + (i,))
    return out


def mutate(body: Any, path: tuple, action: str, replacement: Any) -> Any:
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if action == "drop":
        del parent[last]
    else:
        parent[last] = replacement
    return body


@st.composite
def mutated_body(draw: st.DrawFn, env: str) -> Any:
    body = json.loads(json.dumps(verify_body_for(env, draw(st.sampled_from(examples(env))))))
    for _ in range(draw(st.integers(1, 3))):
        candidates = paths(body)
        if not candidates:
            break
        path = draw(st.sampled_from(candidates))
        action = draw(st.sampled_from(["drop", "swap"]))
        body = mutate(body, path, action, json.loads(json.dumps(draw(st.sampled_from(REPLACEMENTS)))))
    return body


def check_reply(reply: httpx.Response) -> None:
    assert reply.status_code < 500, reply.text
    out = reply.json()
    if reply.status_code >= 400:
        assert out["detail"] and out["error"]["type"], out
        return
    items = out if isinstance(out, list) else [out]
    for item in items:
        assert isinstance(item["reward"], (int, float)), item
        assert "unexpected error" not in (item.get("failure_reason") or ""), item


@pytest.fixture(scope="module")
def client():
    with httpx.Client(timeout=60.0) as c:
        yield c


@pytest.mark.parametrize("env", ENVS)
def test_mutated_verify_bodies_never_500(env_servers, client, env):
    url = env_servers[env].url

    @settings(max_examples=30, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=mutated_body(env))
    def run(body: Any) -> None:
        raw = json.dumps(body)  # ensure_ascii: lone surrogates travel as \\udXXX escapes
        check_reply(client.post(f"{url}/verify", content=raw, headers={"content-type": "application/json"}))

    run()


@pytest.mark.parametrize("env", ENVS)
def test_mutated_batch_items_fail_alone(env_servers, client, env):
    url = env_servers[env].url
    valid = verify_body_for(env, examples(env)[0])

    @settings(max_examples=8, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=mutated_body(env))
    def run(body: Any) -> None:
        raw = json.dumps([valid, body])
        reply = client.post(f"{url}/verify/batch", content=raw, headers={"content-type": "application/json"})
        check_reply(reply)
        if reply.status_code == 200:
            assert reply.json()[0]["mask_sample"] is False

    run()
