"""models/hf (a real server with a small local model): a prompt over `max_prompt_chars` is a 413 before any
rendering or tokenizing, and a long prompt is rendered and tokenized off the event loop, so `/health` is
answered while it is being prepared."""
from __future__ import annotations

import threading
from typing import Any, Iterator

import httpx
import pytest

from gymserve.testing import ServerProcess
from services.models.hf.tiny import tiny_tool_model

LIMIT = 1_000_000


@pytest.fixture(scope="module")
def model() -> Iterator[ServerProcess]:
    with ServerProcess("models/hf", f"model={tiny_tool_model()}", "max_model_len=256", "default_max_tokens=4",
                       f"max_prompt_chars={LIMIT}", ready_timeout_s=300, name="prompt-limit-hf") as proc:
        yield proc


def _words(chars: int) -> str:
    text = " ".join(f"w{i % 9973}x" for i in range(chars // 6))
    return text[:chars]


@pytest.mark.parametrize("path, body", [
    ("/v1/responses", {"model": "m", "input": "x" * (16 * 1024 * 1024)}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x" * (16 * 1024 * 1024)}]}),
    ("/v1/completions", {"model": "m", "prompt": "x" * (LIMIT + 1)}),
    ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "x" * (LIMIT // 2)}, {"type": "input_text", "text": "y" * (LIMIT // 2 + 1)}]}]}),
])
def test_oversized_prompt_is_413(model, path, body):
    reply = model.post(path, json=body)
    assert reply.status_code == 413, reply.text[:300]
    assert "max_prompt_chars" in reply.json()["detail"]
    assert model.get("/health").json() == {"status": "ok"}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_health_is_answered_while_a_long_prompt_is_tokenized(model):
    outcome: dict[str, Any] = {}

    def long_request() -> None:
        outcome["reply"] = model.post("/v1/responses", json={"model": "m", "input": _words(LIMIT - 10)}, timeout=200)

    worker = threading.Thread(target=long_request)
    worker.start()
    answered_in_flight = 0
    try:
        while worker.is_alive():
            health = httpx.get(f"{model.url}/health", timeout=30)
            if worker.is_alive() and health.json() == {"status": "ok"}:
                answered_in_flight += 1
    finally:
        worker.join()
    reply = outcome["reply"]
    assert reply.status_code == 200, reply.text[:300]
    assert reply.json()["context_length_exceeded"] is True  # it was rendered and tokenized: far past 256 tokens
    assert answered_in_flight >= 3


@pytest.mark.parametrize("path, body, named", [
    ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": [{"type": {"a": 1}, "text": "x"}]}]},
     "input[0].content[0].type"),
    ("/v1/responses", {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": [1]}]}]},
     "input[0].content[0].text"),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": [{"type": {}, "text": "x"}]}]},
     "messages[0].content[0].type"),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": {"a": 1}, "content": "x"}]}, "messages[0].role"),
])
def test_wrong_type_in_a_prompt_part_is_400_naming_it(model, path, body, named):
    reply = model.post(path, json=body)
    assert reply.status_code == 400, reply.text[:300]
    assert named in reply.json()["detail"]
