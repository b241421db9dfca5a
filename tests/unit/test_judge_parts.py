"""The judge mechanism's pure parts: templates, strict verdict and score parsing, options, the token bucket."""
from __future__ import annotations

import asyncio
import time

import pytest
from pydantic import ValidationError

from services.core.judge import (EQUIVALENCE_LABELS, JudgeConfig, ModelServerRef, PromptTemplate, TokenBucket,
                                 UnparseableVerdict, judge_target, parse_label, score)


def test_template_renders_named_fields_and_rejects_unknown_ones() -> None:
    template = PromptTemplate("Q: {question}\nA: {answer}", "Be {tone}.", fields=("question", "answer", "tone"))
    assert template.messages(question="2+2?", answer="4", tone="strict") == [
        {"role": "system", "content": "Be strict."}, {"role": "user", "content": "Q: 2+2?\nA: 4"}]
    assert PromptTemplate("{{literal}} {x}", fields=("x",)).messages(x="1") == [
        {"role": "user", "content": "{literal} 1"}]
    with pytest.raises(ValueError, match="unknown field.*qestion"):
        PromptTemplate("{qestion}", fields=("question",))
    with pytest.raises(ValueError, match="plain names"):
        PromptTemplate("{0}", fields=("question",))
    with pytest.raises(KeyError, match="answer"):
        template.messages(question="q", tone="t")


@pytest.mark.parametrize("text, verdict", [
    ("reasoning... My final verdict is [[A=B]]", "[[A=B]]"),
    ("[[A!=B]] and again [[A!=B]]", "[[A!=B]]"),
    ("[[A=B]]", "[[A=B]]"),
])
def test_parse_label_finds_exactly_one_verdict(text: str, verdict: str) -> None:
    assert parse_label(text, EQUIVALENCE_LABELS) == verdict


@pytest.mark.parametrize("text, reason", [
    ("they are the same", "no verdict label"),
    ("[[A=B]] or maybe [[A!=B]]", "conflicting"),
    ("", "no verdict label"),
])
def test_parse_label_is_strict(text: str, reason: str) -> None:
    with pytest.raises(UnparseableVerdict, match=reason):
        parse_label(text, EQUIVALENCE_LABELS)


def test_score_parser() -> None:
    parse = score(1, 10)
    assert parse("Good. [[7]]") == "7" and parse("[[score: 8.5]] ... [[ 8.5 ]]") == "8.5"
    for text, reason in (("8/10", "no score"), ("[[3]] then [[9]]", "conflicting"), ("[[11]]", "outside")):
        with pytest.raises(UnparseableVerdict, match=reason):
            parse(text)


def test_judge_model_server_forms() -> None:
    ref = JudgeConfig(judge_model_server={"type": "responses_api_models", "name": "policy_model"})
    assert isinstance(ref.judge_model_server, ModelServerRef) and judge_target(ref) == "policy_model"
    assert judge_target(JudgeConfig(judge_model_server="http://127.0.0.1:8000/")) == "http://127.0.0.1:8000"
    assert judge_target(JudgeConfig()) is None
    with pytest.raises(ValidationError, match="judge_model_server"):
        JudgeConfig(judge_model_server="  ")
    with pytest.raises(ValidationError, match="judge_model_server"):
        JudgeConfig(judge_model_server={"type": "responses_api_agents", "name": "x"})


def test_token_bucket_refuses_a_wait_past_the_deadline() -> None:
    async def main() -> None:
        bucket = TokenBucket(rate=0.5, burst=2)
        far = time.monotonic() + 60
        await bucket.take(far)
        await bucket.take(far)  # the burst
        with pytest.raises(TimeoutError, match="rate limit"):
            await bucket.take(time.monotonic() + 0.5)  # the next token is ~2 s away
    asyncio.run(main())


def test_token_data_is_left_out_of_judge_records() -> None:
    from services.core.judge import without_token_data

    response = {"output": [{"type": "message", "content": [], "prompt_token_ids": [1], "generation_token_ids": [2],
                            "generation_log_probs": [-0.1]}], "id": "r"}
    assert without_token_data(response) == {"output": [{"type": "message", "content": []}], "id": "r"}
    plain = {"output": [{"type": "message", "content": []}]}
    assert without_token_data(plain) is plain
