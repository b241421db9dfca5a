"""Secrets never come back: every secret shape is redacted in the head's config, in the registry rows it
returns (a registration's extras), in error messages and in `failure_reason`s (real servers)."""
from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
import yaml

from gymserve.testing import ServerProcess, verify_body
from services.core.ports import free_port
from services.core.redaction import redact, redact_text
from services.core.replies import failed_reply
from services.core.schemas import VerifyRequest

SECRET = "s3cr3t-value-do-not-leak"
PEM = f"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk{SECRET}\n-----END OPENSSH PRIVATE KEY-----"


def secret_options() -> dict[str, Any]:
    """Every shape a secret takes in a config: named keys, headers as a map and as {name, value} pairs,
    a bearer value under a harmless name, a PEM block, a password inside a URL."""
    return {
        "Authorization": f"Bearer {SECRET}", "pass": SECRET, "pwd": SECRET, "bearer": SECRET,
        "credentials": {"user": "bob", "password": SECRET}, "credentials_json": SECRET,
        "db_passwd": SECRET, "private_key": PEM, "ssh_key": PEM, "client_secret": SECRET,
        "headers": {"X-Api-Key": SECRET, "Cookie": f"sid={SECRET}"},
        "extra_headers": [{"name": "Authorization", "value": f"Basic {SECRET}"},
                          {"name": "X-Auth-Token", "value": SECRET}, {"name": "Accept", "value": "json"}],
        "note": f"use header Authorization: Bearer {SECRET}",
        "certificate": PEM,
        "base_url": f"http://bob:{SECRET}@127.0.0.1:9/v1",
        "mirrors": [f"https://user:{SECRET}@mirror.invalid/simple"],
        "max_output_tokens": 7, "tokenizer": "plain",
    }


@pytest.fixture(scope="module")
def head() -> Iterator[ServerProcess]:
    stack = {"servers": {"leaky": {"kind": "models/openai_proxy", "port": free_port(), **secret_options()}}}
    env = {"GYMSERVE_SERVER_SPEC": json.dumps({"stack": stack}), "GYMSERVE_API_KEY": "secrets-test-key"}
    with ServerProcess("head", name="head", env=env) as proc:
        yield proc


def _assert_clean(text: str) -> None:
    assert SECRET not in text, text


def test_config_redacts_every_secret_shape(head):
    reply = head.get("/global_config_dict_yaml")
    assert reply.status_code == 200
    _assert_clean(reply.text)
    leaky = yaml.safe_load(reply.json())["leaky"]["responses_api_models"]["openai_proxy"]
    assert leaky["pass"] == leaky["pwd"] == leaky["bearer"] == leaky["Authorization"] == "***"
    assert leaky["credentials"] == {"user": "bob", "password": "***"}
    assert leaky["extra_headers"][0] == {"name": "Authorization", "value": "***"}
    assert leaky["extra_headers"][2] == {"name": "Accept", "value": "json"}  # not a secret: kept
    assert leaky["base_url"] == "http://bob:***@127.0.0.1:9/v1"
    assert "PRIVATE KEY" in leaky["certificate"] and "***" in leaky["certificate"]
    assert leaky["max_output_tokens"] == 7 and leaky["tokenizer"] == "plain"  # counts and names stay readable


def test_registration_extras_come_back_redacted(head):
    body = {"name": "dyn", "host": "127.0.0.1", "port": free_port(), "kind": "resources/exact_match",
            **secret_options()}
    assert head.post("/register", json=body).status_code == 200
    for path in ("/server_instances", "/server_instances/dyn"):
        reply = head.get(path)
        assert reply.status_code == 200
        _assert_clean(reply.text)
    row = head.get("/server_instances/dyn").json()
    assert row["credentials"]["password"] == "***" and row["base_url"].startswith("http://bob:***@")


def test_error_messages_are_redacted(head):
    """An error that echoes what the caller sent (here an unknown server name holding a URL with a password)."""
    reply = head.get(f"/server_instances/http:%2F%2Fbob:{SECRET}@host")
    assert reply.status_code in (404, 422)
    _assert_clean(reply.text)


@pytest.fixture(scope="module")
def workplace() -> Iterator[ServerProcess]:
    with ServerProcess("resources/workplace", name="secrets-workplace") as proc:
        yield proc


def test_resource_error_messages_are_redacted(workplace):
    """A tool call under an unknown session echoes the id in its 409: a token sent there does not come back."""
    for value in (f"Bearer {SECRET}", f"postgres://app:{SECRET}@db/x", f"password={SECRET}"):
        reply = workplace.post("/find_email_address", json={"name": "Bob"}, headers={"X-Session-Id": value})
        assert reply.status_code == 409, reply.text
        assert "unknown session" in reply.json()["detail"]
        _assert_clean(reply.text)


@pytest.mark.parametrize("reason", [
    f"POST http://agent:{SECRET}@10.0.0.1:8000/verify failed",
    f"upstream said: Authorization: Bearer {SECRET}",
    f"key file:\n{PEM}",
    f"connect failed (api_key={SECRET})",
])
def test_failure_reasons_are_redacted(reason):
    request = VerifyRequest.model_validate(verify_body("x"))
    reply = failed_reply(request, "upstream", reason).dump()
    _assert_clean(json.dumps(reply))
    assert reply["mask_sample"] is True and reply["failure_reason"]


def test_redaction_keeps_what_is_not_secret():
    data = {"url": "http://127.0.0.1:8000/v1", "passed": 3, "bypass_cache": True, "max_tokens": 5,
            "end_token": "<|im_end|>", "max_tokens_per_batch": 9, "usage": {"prompt_tokens": 4},
            "prompt_token_ids": [1, 2], "name": "policy", "auth": {"user": "bob", "token": SECRET}}
    out = redact(data)
    assert out == {**data, "auth": {"user": "bob", "token": "***"}}
    assert redact({"api_tokens": [SECRET], "hf_token": SECRET}) == {"api_tokens": ["***"], "hf_token": "***"}
    for harmless in ("no secrets here: http://host/x?q=1", "Basic idea", "max_tokens=5 exceeded",
                     "api_key: expected a string", "missing bearer token (set Authorization: Bearer <KEY>)"):
        assert redact_text(harmless) == harmless
    assert SECRET not in redact_text(f"X-Auth-Token: {SECRET}, Authorization: Basic dXNlcjpwYXNz")


def test_agent_failure_reason_is_redacted():
    """A real rollout whose resource server is down: the masked reply's reason names the URL, without its password."""
    dead = f"http://agent:{SECRET}@127.0.0.1:{free_port()}"
    with ServerProcess("agents/simple_agent", f"resources_url={dead}", f"model_url={dead}", "step_deadline_s=5",
                       name="secrets-agent") as agent:
        reply = agent.post("/run", json={"responses_create_params": {"input": "hi"}})
    _assert_clean(reply.text)
    body = reply.json()
    assert body["mask_sample"] is True and "agent:***@127.0.0.1" in body["failure_reason"], body
