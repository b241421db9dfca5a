"""models/hf with the real `openai` client against a real server subprocess.

The model is a tiny 2-layer Llama with SmolLM2's tokenizer and template, taught one tool
conversation (call get_weather, then answer) so tool calls really come out of generation.
One slow test runs the real embedded SmolLM2-135M-Instruct.
"""
from __future__ import annotations

import concurrent.futures
import json
import math
import uuid

import httpx
import pytest
from openai import BadRequestError, OpenAI

from gymserve.testing import ServerProcess
from services.models.hf.tiny import (WEATHER_ANSWER, WEATHER_CALL, WEATHER_QUESTION, WEATHER_RESULT, WEATHER_TOOLS,
                                     tiny_tool_model, weather_messages)

RESPONSES_TOOLS = [{"type": "function", **WEATHER_TOOLS[0]["function"]}]


@pytest.fixture(scope="module")
def server():
    path = tiny_tool_model()
    with ServerProcess("models/hf", f"model={path}", "max_batch_size=8", "max_model_len=1024",
                       "default_max_tokens=32", "max_n=4") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _extra(obj) -> dict:
    return obj.model_extra or {}


def _check_training(fields: dict, prompt_tokens: int, completion_tokens: int) -> None:
    assert len(fields["prompt_token_ids"]) == prompt_tokens
    assert len(fields["generation_token_ids"]) == completion_tokens == len(fields["generation_log_probs"])
    assert all(math.isfinite(lp) and lp <= 0 for lp in fields["generation_log_probs"])


def test_models_lists_the_served_model(client) -> None:
    names = [m.id for m in client.models.list().data]
    assert len(names) == 1 and names[0].startswith("tiny-weather")


def test_chat_tool_call_with_training_fields(client) -> None:
    reply = client.chat.completions.create(model="any-name", messages=weather_messages(0), tools=WEATHER_TOOLS,
                                           temperature=0, max_tokens=40)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == WEATHER_CALL["name"]
    assert json.loads(call.function.arguments) == WEATHER_CALL["arguments"]
    fields = _extra(choice.message)
    _check_training(fields, reply.usage.prompt_tokens, reply.usage.completion_tokens)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_chat_answer_after_tool_result_and_logprobs(client) -> None:
    reply = client.chat.completions.create(model="m", messages=weather_messages(1), tools=WEATHER_TOOLS,
                                           temperature=0, max_tokens=40, logprobs=True, top_logprobs=3)
    choice = reply.choices[0]
    assert choice.message.content == WEATHER_ANSWER and choice.finish_reason == "stop"
    fields = _extra(choice.message)
    entries = choice.logprobs.content
    assert len(entries) == len(fields["generation_token_ids"])
    for entry, lp in zip(entries, fields["generation_log_probs"]):
        assert entry.logprob == pytest.approx(lp) and entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6  # greedy picks the top token
        assert all(math.isfinite(t.logprob) and t.logprob <= 0 for t in entry.top_logprobs)


def test_responses_function_call_then_answer_with_token_continuity(client) -> None:
    """A multi-turn tool conversation: turn 2's prompt IDs begin with turn 1's prompt + generated IDs."""
    session = {"X-Session-Id": f"s-{uuid.uuid4().hex}"}
    items: list = [{"role": "user", "content": WEATHER_QUESTION}]
    first = client.responses.create(model="m", input=items, tools=RESPONSES_TOOLS, temperature=0,
                                    max_output_tokens=40, extra_headers=session)
    assert [o.type for o in first.output] == ["function_call"]
    call = first.output[0]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    f1 = _extra(call)
    _check_training(f1, first.usage.input_tokens, first.usage.output_tokens)
    items += [o.model_dump(exclude_none=True) for o in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": WEATHER_RESULT})
    second = client.responses.create(model="m", input=items, tools=RESPONSES_TOOLS, temperature=0,
                                     max_output_tokens=40, extra_headers=session)
    assert second.output_text == WEATHER_ANSWER and second.status == "completed"
    f2 = _extra(second.output[-1])
    previous = f1["prompt_token_ids"] + f1["generation_token_ids"]
    assert f2["prompt_token_ids"][:len(previous)] == previous
    assert len(f2["prompt_token_ids"]) > len(previous)
    assert "token_continuity_broken" not in f2

    # The agent edits the model's call: continuity cannot hold, and the item says so.
    edited = [dict(i) for i in items[:-1]]
    edited[1]["arguments"] = json.dumps({"city": "Lyon"})
    items3 = edited + [items[-1], {"role": "user", "content": "thanks"}]
    third = client.responses.create(model="m", input=items3, tools=RESPONSES_TOOLS, temperature=0,
                                    max_output_tokens=4, extra_headers=session)
    assert _extra(third.output[-1]).get("token_continuity_broken") is True


def test_chat_stream_matches_non_stream(client) -> None:
    kwargs = dict(model="m", messages=weather_messages(1), tools=WEATHER_TOOLS, temperature=0, max_tokens=40)
    expected = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals[-1].choices[0].finish_reason == "stop"
    assert _extra(finals[-1].choices[0])["generation_token_ids"]
    assert chunks[-1].usage.completion_tokens == len(_extra(finals[-1].choices[0])["generation_token_ids"])


def test_chat_stream_tool_call(client) -> None:
    chunks = list(client.chat.completions.create(model="m", messages=weather_messages(0), tools=WEATHER_TOOLS,
                                                 temperature=0, max_tokens=40, stream=True))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls and calls[0].function.name == "get_weather"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_responses_stream_events(client) -> None:
    events = list(client.responses.create(model="m", input=[{"role": "user", "content": WEATHER_QUESTION}] + [
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": WEATHER_RESULT}],
        tools=RESPONSES_TOOLS, temperature=0, max_output_tokens=40, stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == WEATHER_ANSWER
    assert _extra(final.output[-1])["generation_token_ids"]


def test_responses_stream_function_call(client) -> None:
    events = list(client.responses.create(model="m", input=WEATHER_QUESTION, tools=RESPONSES_TOOLS, temperature=0,
                                          max_output_tokens=40, stream=True))
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and json.loads(done[0].arguments) == {"city": "Paris"}
    assert events[-1].response.output[-1].type == "function_call"


def test_seeded_sampling_is_reproducible_and_n_choices(client) -> None:
    kwargs = dict(model="m", messages=[{"role": "user", "content": "Say something random."}], temperature=1.5,
                  top_p=0.95, max_tokens=12, seed=1234, n=3)
    a = client.chat.completions.create(**kwargs)
    b = client.chat.completions.create(**kwargs)
    ids_a = [_extra(c.message)["generation_token_ids"] for c in a.choices]
    ids_b = [_extra(c.message)["generation_token_ids"] for c in b.choices]
    assert len(ids_a) == 3 and ids_a == ids_b
    assert len({tuple(i) for i in ids_a}) > 1  # each choice has its own stream of randomness
    assert a.usage.completion_tokens == sum(len(i) for i in ids_a)


def test_stop_sequence_and_max_tokens(client) -> None:
    full = client.chat.completions.create(model="m", messages=weather_messages(1), temperature=0, max_tokens=40,
                                          tools=WEATHER_TOOLS).choices[0].message.content
    cut = client.chat.completions.create(model="m", messages=weather_messages(1), temperature=0, max_tokens=40,
                                         tools=WEATHER_TOOLS, stop=["sunny"]).choices[0]
    assert cut.message.content == full[:full.index("sunny")] and cut.finish_reason == "stop"
    short = client.chat.completions.create(model="m", messages=weather_messages(1), temperature=0, max_tokens=2,
                                           tools=WEATHER_TOOLS)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 2


def test_batched_greedy_equals_unbatched(client) -> None:
    """Concurrent requests are decoded in one left-padded batch; greedy tokens must match one-by-one decoding.

    Left padding changes float rounding slightly, so where tokens differ the two candidates must have
    been near-ties (logprob gap < 1e-3); identical logprobs are compared with a tolerance."""
    prompts = [[{"role": "user", "content": "x" * k}] for k in (1, 7, 30, 90)]

    def ask(messages):
        r = client.chat.completions.create(model="m", messages=messages, temperature=0, max_tokens=16,
                                           logprobs=True, top_logprobs=2)
        return r.choices[0]

    alone = [ask(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(ask, prompts))
    for a, b in zip(alone, together):
        ids_a, ids_b = _extra(a.message)["generation_token_ids"], _extra(b.message)["generation_token_ids"]
        for pos, (x, y) in enumerate(zip(ids_a, ids_b)):
            if x != y:
                tops = a.logprobs.content[pos].top_logprobs
                assert abs(tops[0].logprob - tops[1].logprob) < 1e-3
                break
            assert a.logprobs.content[pos].logprob == pytest.approx(b.logprobs.content[pos].logprob, abs=1e-3)
        else:
            assert len(ids_a) == len(ids_b)


def test_context_overflow_is_an_empty_length_completion(server, client) -> None:
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 1200}],
                                           max_tokens=5)
    assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content == ""
    assert _extra(reply)["context_length_exceeded"] is True
    long_prompt = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 900}],
                                                 max_tokens=500)
    assert long_prompt.usage.prompt_tokens + long_prompt.usage.completion_tokens <= 1024


@pytest.mark.parametrize("body, needle", [
    ({"model": "m"}, "messages"),
    ({"model": "m", "messages": []}, "messages"),
    ({"model": "m", "messages": "hi"}, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 99}, "max_n"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
    ({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 50}, "top_logprobs"),
])
def test_bad_chat_requests_are_400(server, body, needle) -> None:
    r = server.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["detail"]


def test_bad_responses_requests_are_400(server, client) -> None:
    assert server.post("/v1/responses", json={"model": "m"}).status_code == 400
    assert server.post("/v1/responses", content=b"{not json").status_code == 400
    r = server.post("/v1/responses", json={"input": "hi", "max_output_tokens": -3})
    assert r.status_code == 400 and "max_output_tokens" in r.json()["detail"]
    with pytest.raises(BadRequestError):
        client.responses.create(model="m", input=[{"type": "mystery"}])


def test_health_and_metrics(server) -> None:
    assert httpx.get(f"{server.url}/ready").status_code == 200
    assert "gymserve" in server.get("/metrics").text


@pytest.mark.slow
def test_embedded_smollm2_end_to_end(tmp_path) -> None:
    """The real embedded SmolLM2-135M-Instruct (no model option): short generations through both APIs."""
    with ServerProcess("models/hf", "default_max_tokens=16", ready_timeout_s=600) as proc:
        client = OpenAI(base_url=f"{proc.url}/v1", api_key="unused", max_retries=0, timeout=300)
        assert client.models.list().data[0].id == "SmolLM2-135M-Instruct"
        chat = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "What is 2+2?"}],
                                              temperature=0, max_tokens=12)
        assert chat.choices[0].message.content.strip()
        _check_training(_extra(chat.choices[0].message), chat.usage.prompt_tokens, chat.usage.completion_tokens)
        resp = client.responses.create(model="x", input="Name a colour.", max_output_tokens=8, extra_body={"seed": 3})
        assert resp.output_text.strip() and _extra(resp.output[-1])["generation_log_probs"]
        # token continuity on a real model: the second turn's prompt extends the first turn's IDs
        session = {"X-Session-Id": f"s-{uuid.uuid4().hex}"}
        items: list = [{"role": "user", "content": "Say hello."}]
        first = client.responses.create(model="x", input=items, max_output_tokens=10, temperature=0.7,
                                        extra_headers=session)
        items += [o.model_dump(exclude_none=True) for o in first.output] + [{"role": "user", "content": "Again."}]
        second = client.responses.create(model="x", input=items, max_output_tokens=4, extra_headers=session)
        f1, f2 = _extra(first.output[-1]), _extra(second.output[-1])
        previous = f1["prompt_token_ids"] + f1["generation_token_ids"]
        assert f2["prompt_token_ids"][:len(previous)] == previous and "token_continuity_broken" not in f2


@pytest.mark.slow
def test_concurrent_first_conversion_is_safe(tmp_path) -> None:
    """Two processes start with an empty cache at once: one converts the GGUF, the other waits; both
    get the same complete safetensors folder."""
    import subprocess
    import sys

    code = "from services.models.hf.embedded import embedded_model_dir; print(embedded_model_dir())"
    env = {**__import__("os").environ, "GYMSERVE_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              env=env, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0] == outs[1] == str(tmp_path / "models" / "smollm2-135m-instruct")
    folder = tmp_path / "models" / "smollm2-135m-instruct"
    assert (folder / "model.safetensors").stat().st_size > 100_000_000
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.startswith(".smollm2") and p.is_dir()]


def test_static_batching_without_weight_updates(tmp_path) -> None:
    """`continuous_batching=false` (a batch runs to its end before the next starts) answers what the
    continuous engine answers; `accept_weights=false` refuses `POST /v1/weights` (403) naming the option."""
    with ServerProcess("models/hf", f"model={tiny_tool_model()}", "max_batch_size=4", "max_model_len=1024",
                       "default_max_tokens=32", "continuous_batching=false", "accept_weights=false") as proc:
        static = OpenAI(base_url=f"{proc.url}/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(k: int):
            return static.chat.completions.create(model="m", messages=weather_messages(k), tools=WEATHER_TOOLS,
                                                  temperature=0, max_tokens=40).choices[0]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # four rows share one static batch
            calls, answers, *_ = list(pool.map(ask, [0, 1, 0, 1]))
        assert calls.finish_reason == "tool_calls"
        assert json.loads(calls.message.tool_calls[0].function.arguments) == WEATHER_CALL["arguments"]
        assert answers.finish_reason == "stop" and answers.message.content == WEATHER_ANSWER
        refused = httpx.post(f"{proc.url}/v1/weights", json={"path": str(tmp_path / "w.safetensors"), "version": 1},
                             timeout=30)
        assert refused.status_code == 403 and "accept_weights=true" in refused.json()["detail"]
        models = httpx.get(f"{proc.url}/v1/models", timeout=30).json()["data"][0]
        assert models["weights_version"] == 0
