"""equivalence_llm_judge: a judge model decides whether the response's answer is equivalent to the
row's `expected_answer` (NeMo-Gym's environment of that name: its row fields, prompt fields and labels).

Short free-form answers ("darwin" vs "Charles Darwin") that no string or math check can decide.
The judge is asked in both orders (`check_twice_swap`) because judges favour one position.
"""
from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from pydantic import Field, field_validator, model_validator

from services.core.errors import BadRequest
from services.core.judge import (Judge, JudgeConfig, JudgeFailure, PromptTemplate, equal_in_orders,
                                 judge_failed_reply, question_text)
from services.core.replies import scored_reply
from services.core.resource import Environment, Session, create_resource_app
from services.core.schemas import VerifyReply, VerifyRequest

JUDGE_SYSTEM_MESSAGE = """You grade a candidate answer against a GOLD reference answer to a question.
Decide whether they are equivalent: the same fact, value, entity or set of parts, whatever the wording, \
spelling variants, abbreviations or formatting. A candidate that adds a wrong claim, or misses a part \
the GOLD requires, is not equivalent. Explain briefly, then end with exactly one verdict label:
- equivalent: [[A=B]]
- not equivalent: [[A!=B]]"""
JUDGE_PROMPT_TEMPLATE = "QUESTION:\n{question}\n\nGOLD:\n{expected_answer}\n\nCANDIDATE:\n{generated_answer}"
JUDGE_FIELDS = ("question", "expected_answer", "generated_answer")


class Config(JudgeConfig):
    judge_system_message: str | None = Field(JUDGE_SYSTEM_MESSAGE, description="the judge's system message")
    judge_prompt_template: str = Field(JUDGE_PROMPT_TEMPLATE, description="the judge's user message; fields "
                                                                          "{question}, {expected_answer}, "
                                                                          "{generated_answer}")
    judge_equal_label: str = Field("[[A=B]]", min_length=1, description="the judge's label for equivalent")
    judge_not_equal_label: str = Field("[[A!=B]]", min_length=1, description="the judge's label for different")
    check_twice_swap: bool = Field(True, description="after an equal verdict, ask again with the answers swapped")
    reward_if_swap_fails: float = Field(0.0, description="reward when the swapped question says not equal")
    response_extract_regex: str | None = Field(None, description="the answer is the last match (its first "
                                                                 "non-empty group) in the response; none: all")
    question_extract_regex: str | None = Field(None, description="the question is the last match in the last "
                                                                 "user message; none: all of it")

    @field_validator("response_extract_regex", "question_extract_regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _check(self) -> "Config":
        if self.judge_model_server is None:
            raise ValueError("judge_model_server: missing (an instance name, "
                             "{type: responses_api_models, name: ...} or a URL)")
        if self.judge_equal_label == self.judge_not_equal_label:
            raise ValueError("judge_not_equal_label: must differ from judge_equal_label")
        PromptTemplate(self.judge_prompt_template, self.judge_system_message, fields=JUDGE_FIELDS)
        return self


class EquivalenceRequest(VerifyRequest):
    """`/verify` body: the row's `expected_answer` (and optional `question`) plus the model's response."""

    expected_answer: str | int | float = Field(description="the reference answer")
    question: str | None = Field(None, description="shown to the judge; default: the last user message")


class EquivalenceReply(VerifyReply):
    """Adds `extracted_answer` (what the judge was shown) and `judge_evaluations` (one per judge question)."""

    extracted_answer: str | None = None
    judge_evaluations: list[dict[str, Any]] | None = None


def last_match(text: str, pattern: str | None) -> str:
    """`text`, or the last match of `pattern` in it (its first non-empty group); no match: `text`."""
    if not pattern:
        return text.strip()
    matches = list(re.finditer(pattern, text, flags=re.MULTILINE | re.DOTALL))
    if not matches:
        return text.strip()
    last = matches[-1]
    for group in last.groups():
        if group and group.strip():
            return group.strip()
    return last.group(0).strip()


class EquivalenceLLMJudge(Environment):
    config_model = Config
    request_model = EquivalenceRequest
    reply_model = EquivalenceReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "Who proposed the theory of "
                                                          "evolution by natural selection?"}]},
                   "expected_answer": "Charles Darwin"}
    example_answer = "Darwin"
    description = "Reward 1.0 when a judge model finds the response's answer equivalent to expected_answer."
    config: Config
    judge: Judge
    template: PromptTemplate

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.template = PromptTemplate(config.judge_prompt_template, config.judge_system_message, fields=JUDGE_FIELDS)

    async def startup(self) -> None:
        await super().startup()
        self.judge = Judge(self.config, metrics=self.metrics.judges if self.metrics else None)

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        expected = request.field("expected_answer")
        if isinstance(expected, bool) or not isinstance(expected, (str, int, float)) or not str(expected).strip():
            raise BadRequest("expected_answer: missing, empty, or not a string")
        expected = str(expected).strip()
        answer = last_match(request.text(), self.config.response_extract_regex)
        if not answer:  # nothing to judge: the model's fault, a 0 without asking the judge
            return scored_reply(request, 0.0, extracted_answer=None, judge_evaluations=[])
        question = last_match(question_text(request), self.config.question_extract_regex)
        orders = [{"question": question, "expected_answer": expected, "generated_answer": answer}]
        if self.config.check_twice_swap:
            orders.append({"question": question, "expected_answer": answer, "generated_answer": expected})
        labels = (self.config.judge_equal_label, self.config.judge_not_equal_label)
        try:
            equal, evaluations = await equal_in_orders(self.judge, self.template, orders,
                                                       equal=labels[0], choices=labels)
        except JudgeFailure as exc:
            return judge_failed_reply(request, exc, extracted_answer=answer)
        first_equal = evaluations[0]["verdict_label"] == labels[0]
        reward = 1.0 if equal else (self.config.reward_if_swap_fails if first_equal else 0.0)
        return scored_reply(request, reward, extracted_answer=answer, judge_evaluations=evaluations)


def build(config: Config) -> FastAPI:
    return create_resource_app(EquivalenceLLMJudge(config))
