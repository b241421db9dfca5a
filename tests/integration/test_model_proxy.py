"""models/openai_proxy in front of a real models/hf upstream, driven by the real `openai` client.

The upstream is the tiny taught test model (see test_model_hf.py); it requires a bearer key,
which the proxy reads from an environment variable. A dead port stands in for an unreachable
second upstream.
"""
from __future__ import annotations

import json
import uuid

import pytest
from openai import OpenAI

from gymserve.testing import ServerProcess
from services.core.ports import free_port
from services.models.hf.tiny import (WEATHER_ANSWER, WEATHER_QUESTION, WEATHER_RESULT, WEATHER_TOOLS,
                                     tiny_tool_model, weather_messages)

RESPONSES_TOOLS = [{"type": "function", **WEATHER_TOOLS[0]["function"]}]
UPSTREAM_KEY = "upstream-secret-key"


@pytest.fixture(scope="module")
def upstream():
    with ServerProcess("models/hf", f"model={tiny_tool_model()}", "max_model_len=1024", "context_overflow=error",
                       "max_n=4", env={"GYMSERVE_API_KEY": UPSTREAM_KEY}) as proc:
        yield proc


def _proxy(upstream, *options: str):
    env = {"UPSTREAM_KEY": UPSTREAM_KEY, "GYMSERVE_API_KEY": ""}
    return ServerProcess("models/openai_proxy", f"base_url={upstream.url}", "api_key=${UPSTREAM_KEY}", *options,
                         name="proxy", env=env)


@pytest.fixture(scope="module")
def proxy(upstream):
    with _proxy(upstream) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(proxy) -> OpenAI:
    return OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _extra(obj) -> dict:
    return obj.model_extra or {}


def test_upstream_really_requires_the_key(upstream) -> None:
    assert upstream.post("/v1/chat/completions", json={}, headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_chat_tool_call_through_proxy(client) -> None:
    reply = client.chat.completions.create(model="m", messages=weather_messages(0), tools=WEATHER_TOOLS,
                                           temperature=0, max_tokens=40)
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    fields = _extra(reply.choices[0].message)
    assert len(fields["prompt_token_ids"]) == reply.usage.prompt_tokens
    assert len(fields["generation_token_ids"]) == len(fields["generation_log_probs"]) == reply.usage.completion_tokens
    assert all(lp <= 0 for lp in fields["generation_log_probs"])
    assert reply.choices[0].logprobs is None  # asked upstream for training, not shown unless requested


def test_responses_converted_to_chat_with_continuity(client) -> None:
    session = {"X-Session-Id": f"s-{uuid.uuid4().hex}"}
    items: list = [{"role": "user", "content": WEATHER_QUESTION}]
    first = client.responses.create(model="m", input=items, tools=RESPONSES_TOOLS, temperature=0,
                                    max_output_tokens=40, extra_headers=session)
    call = first.output[-1]
    assert call.type == "function_call" and call.name == "get_weather"
    f1 = _extra(call)
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": WEATHER_RESULT})
    second = client.responses.create(model="m", input=items, tools=RESPONSES_TOOLS, temperature=0,
                                     max_output_tokens=40, extra_headers=session)
    assert second.output_text == WEATHER_ANSWER
    f2 = _extra(second.output[-1])
    previous = f1["prompt_token_ids"] + f1["generation_token_ids"]
    assert f2["prompt_token_ids"][:len(previous)] == previous
    assert "token_continuity_broken" not in f2
    assert second.usage.input_tokens == len(f2["prompt_token_ids"])


def test_proxy_flags_broken_continuity(client) -> None:
    session = {"X-Session-Id": f"s-{uuid.uuid4().hex}"}
    client.chat.completions.create(model="m", messages=weather_messages(0), tools=WEATHER_TOOLS, temperature=0,
                                   max_tokens=40, extra_headers=session)
    other = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "unrelated"}],
                                           temperature=0, max_tokens=3, extra_headers=session)
    assert _extra(other.choices[0].message).get("token_continuity_broken") is True


def test_streaming_through_proxy(client) -> None:
    chunks = list(client.chat.completions.create(model="m", messages=weather_messages(1), tools=WEATHER_TOOLS,
                                                 temperature=0, max_tokens=40, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == WEATHER_ANSWER
    assert chunks[-1].choices[0].finish_reason == "stop"
    events = list(client.responses.create(model="m", input=WEATHER_QUESTION, tools=RESPONSES_TOOLS,
                                          temperature=0, max_output_tokens=40, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response.output[-1].type == "function_call"
    assert _extra(events[-1].response.output[-1])["generation_token_ids"]


def test_upstream_errors_keep_status_and_message(proxy) -> None:
    r = proxy.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 "n": 4, "max_tokens": 0})
    assert r.status_code == 400 and "max_tokens" in r.json()["detail"]  # caught by the proxy itself
    r = proxy.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 "n": 5})
    assert r.status_code == 400 and "max_n" in r.json()["detail"]  # the upstream's 400, passed on


def test_context_overflow_becomes_empty_length_completion(client) -> None:
    long = [{"role": "user", "content": "word " * 1200}]
    reply = client.chat.completions.create(model="m", messages=long, max_tokens=5)
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content == ""
    assert _extra(reply)["context_length_exceeded"] is True
    resp = client.responses.create(model="m", input="word " * 1200, max_output_tokens=5)
    assert resp.status == "incomplete" and resp.output_text == ""
    assert _extra(resp)["context_length_exceeded"] is True


def test_responses_passthrough_upstream(upstream) -> None:
    with _proxy(upstream, "upstream_api=responses") as proc:
        client = OpenAI(base_url=f"{proc.url}/v1", api_key="unused", max_retries=0, timeout=120)
        resp = client.responses.create(model="m", input=WEATHER_QUESTION, tools=RESPONSES_TOOLS, temperature=0,
                                       max_output_tokens=40)
        assert resp.output[-1].type == "function_call"
        assert _extra(resp.output[-1])["generation_token_ids"]


def test_sessions_are_pinned_to_one_upstream(upstream) -> None:
    """base_urls = [live, dead]: every session always lands on the same one, and both are used."""
    dead = f"http://127.0.0.1:{free_port()}"
    with _proxy(upstream, f"base_urls=[{upstream.url},{dead}]", "retries=0") as proc:
        outcomes: dict[str, set[int]] = {}
        for i in range(8):
            sid = f"pin-{i}"
            for _ in range(2):
                r = proc.post("/v1/chat/completions", headers={"X-Session-Id": sid}, json={
                    "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
                outcomes.setdefault(sid, set()).add(r.status_code)
        assert all(len(codes) == 1 for codes in outcomes.values())
        assert {next(iter(c)) for c in outcomes.values()} == {200, 502}


def test_missing_upstream_is_a_config_error() -> None:
    with pytest.raises(RuntimeError, match="base_url"):
        with ServerProcess("models/openai_proxy", name="proxy-bad", ready_timeout_s=30):
            pass


def test_completions_mode_token_in_token_out_with_continuity(upstream) -> None:
    """upstream_api=completions: the proxy renders and tokenizes (splicing the session's IDs) and the upstream
    generates from token IDs, as with a plain vLLM server; a multi-turn tool conversation keeps continuity."""
    with _proxy(upstream, "upstream_api=completions", f"tokenizer={tiny_tool_model()}") as proc:
        client = OpenAI(base_url=f"{proc.url}/v1", api_key="unused", max_retries=0, timeout=120)
        session = {"X-Session-Id": f"s-{uuid.uuid4().hex}"}
        items: list = [{"role": "user", "content": WEATHER_QUESTION}]
        first = client.responses.create(model="m", input=items, tools=RESPONSES_TOOLS, temperature=0,
                                        max_output_tokens=40, extra_headers=session)
        call = first.output[-1]
        assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
        f1 = _extra(call)
        items += [o.model_dump(exclude_none=True) for o in first.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": WEATHER_RESULT})
        second = client.responses.create(model="m", input=items, tools=RESPONSES_TOOLS, temperature=0,
                                         max_output_tokens=40, extra_headers=session)
        assert second.output_text == WEATHER_ANSWER
        f2 = _extra(second.output[-1])
        previous = f1["prompt_token_ids"] + f1["generation_token_ids"]
        assert f2["prompt_token_ids"][:len(previous)] == previous and "token_continuity_broken" not in f2
        assert all(lp <= 0 for lp in f2["generation_log_probs"])
        long = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 1200}],
                                              max_tokens=5)
        assert long.choices[0].finish_reason == "length" and _extra(long)["context_length_exceeded"] is True


def test_hf_completions_endpoint_rejects_bad_token_ids(upstream) -> None:
    r = upstream.post("/v1/completions", json={"model": "m", "prompt": [1, -5]},
                      headers={"Authorization": f"Bearer {UPSTREAM_KEY}"})
    assert r.status_code == 400 and "token IDs" in r.json()["detail"]


def test_proxy_reads_token_ids_from_a_vllm_shaped_upstream() -> None:
    """The upstream answers as vLLM does (`reply_format=vllm`: token IDs only through vLLM's request extras,
    at the choice and top level, logprob tokens as token_id:N): the proxy's vLLM branch rebuilds the training
    fields, the same IDs a gymserve-shaped reply carries."""
    with ServerProcess("models/hf", f"model={tiny_tool_model()}", "max_model_len=1024", "reply_format=vllm",
                       name="vllm_shaped") as upstream, \
            ServerProcess("models/openai_proxy", f"base_url={upstream.url}", name="proxy_vllm") as proxy:
        plain = upstream.post("/v1/chat/completions", json={"messages": weather_messages(1), "temperature": 0,
                                                            "max_tokens": 16}).json()
        assert "generation_token_ids" not in plain["choices"][0]["message"] and "token_ids" not in plain["choices"][0]
        raw = upstream.post("/v1/chat/completions", json={
            "messages": weather_messages(1), "tools": WEATHER_TOOLS, "temperature": 0, "max_tokens": 16,
            "logprobs": True, "return_token_ids": True, "return_tokens_as_token_ids": True}).json()
        vllm_ids, vllm_prompt = raw["choices"][0]["token_ids"], raw["prompt_token_ids"]
        assert [e["token"] for e in raw["choices"][0]["logprobs"]["content"]] == [f"token_id:{t}" for t in vllm_ids]
        client = OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(model="m", messages=weather_messages(1), tools=WEATHER_TOOLS,
                                               temperature=0, max_tokens=16)
    assert reply.choices[0].message.content == WEATHER_ANSWER
    fields = _extra(reply.choices[0].message)
    assert fields["generation_token_ids"] == vllm_ids and fields["prompt_token_ids"] == vllm_prompt
    assert len(fields["generation_log_probs"]) == len(vllm_ids) and all(lp <= 0 for lp in fields["generation_log_probs"])
