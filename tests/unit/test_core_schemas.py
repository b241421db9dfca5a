"""Wire models: unknown fields kept and echoed, reward = sum of components, failures masked."""
from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from services.core.replies import failed_reply, scored_reply
from services.core.schemas import DatasetRow, VerifyReply, VerifyRequest, response_text
from gymserve.testing import verify_body


def test_dataset_row_keeps_task_fields():
    row = {"responses_create_params": {"input": [{"role": "user", "content": "2+2?"}], "seed": 7},
           "agent_ref": {"type": "responses_api_agents", "name": "math_simple_agent"},
           "expected_answer": "4", "meta": {"source": "x", "ids": [1, 2]}}
    parsed = DatasetRow.model_validate(row)
    assert parsed.agent_ref is not None and parsed.agent_ref.name == "math_simple_agent"
    dumped = parsed.dump()
    assert dumped["expected_answer"] == "4" and dumped["meta"] == {"source": "x", "ids": [1, 2]}
    assert dumped["responses_create_params"]["seed"] == 7


def test_verify_reply_echoes_request_fields():
    request = VerifyRequest.model_validate(verify_body(" hello ", expected_answer="hello", question_id=42))
    assert request.text() == " hello " and request.field("question_id") == 42
    reply = scored_reply(request, 1.0)
    out = reply.dump()
    assert out["question_id"] == 42 and out["expected_answer"] == "hello" and out["reward"] == 1.0
    assert out["mask_sample"] is False


def test_reward_is_sum_of_components():
    body = verify_body("x")
    reply = VerifyReply.model_validate({**body, "reward": 99.0, "reward_components": {"format": 0.25, "answer": 1.0}})
    assert reply.reward == pytest.approx(1.25)
    with pytest.raises(ValidationError):
        VerifyReply.model_validate({**body, "reward": math.nan})


def test_failed_reply_is_masked_not_zero_reward():
    reply = failed_reply(VerifyRequest.model_validate(verify_body("x", task="t")), "timeout", "took too long")
    assert reply.mask_sample is True and reply.failure_kind == "timeout" and reply.failure_reason == "took too long"
    assert reply.field("task") == "t"
    with pytest.raises(ValueError):
        failed_reply({"response": {"output": []}}, "not_a_kind", "r")


def test_response_text_only_assistant_messages():
    response = {"output": [
        {"type": "reasoning", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"},
                                                              {"type": "output_text", "text": "b"}]},
        {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"},
    ]}
    assert response_text(response) == "ab"
