"""llm_judge: a judge model scores the response against a rubric on a score scale, normalized to [0, 1].

The rubric comes from the row (`rubric`) or the environment (`rubric` option). A rubric given as a
list of items is scored item by item (one judge question each, asked concurrently), and the reply
carries one reward component per item (weight × normalized score / total weight), so GDPO-style
trainers can normalize each criterion on its own; `reward` is their sum.
"""
from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field, TypeAdapter, ValidationError, model_validator

from services.core.config import describe_validation_error
from services.core.errors import BadRequest
from services.core.judge import (Evaluation, Judge, JudgeConfig, JudgeFailure, PromptTemplate, judge_failed_reply,
                                 question_text, score)
from services.core.replies import scored_reply
from services.core.resource import Environment, Session, create_resource_app
from services.core.schemas import VerifyReply, VerifyRequest

JUDGE_SYSTEM_MESSAGE = """You grade an assistant's response to a user's request against a rubric.
Read the rubric, judge only what it asks about, and be strict. Give a short justification, then end \
with the score in double brackets, for example [[{score_max}]]: an integer from {score_min} (fails the \
rubric) to {score_max} (fully meets it)."""
JUDGE_PROMPT_TEMPLATE = ("[Request]\n{question}\n\n[Reference answer (may be empty)]\n{reference}\n\n"
                         "[Rubric]\n{rubric}\n\n[Response]\n{response}")
JUDGE_FIELDS = ("question", "reference", "rubric", "response", "score_min", "score_max")
EXAMPLE_JUDGE_REPLY = "Meets the rubric. [[10]]"  # what `gymserve check`'s scripted judge answers


class RubricItem(BaseModel):
    """One criterion of a rubric scored on its own (a reward component)."""

    name: str = Field(min_length=1, max_length=100, description="the reward component's name")
    criterion: str = Field(min_length=1, description="what the judge checks")
    weight: float = Field(1.0, gt=0, description="share of the reward (weights are normalized)")


Rubric = str | list[RubricItem]
_RUBRIC = TypeAdapter(Rubric)


class Config(JudgeConfig):
    rubric: Rubric | None = Field(None, description="the default rubric: text, or a list of "
                                                    "{name, criterion, weight} items; a row's `rubric` wins")
    score_min: int = Field(1, description="the lowest score on the judge's scale")
    score_max: int = Field(10, description="the highest score on the judge's scale")
    judge_system_message: str | None = Field(JUDGE_SYSTEM_MESSAGE, description="the judge's system message")
    judge_prompt_template: str = Field(JUDGE_PROMPT_TEMPLATE, description="the judge's user message; fields "
                                       "{question}, {reference}, {rubric}, {response}, {score_min}, {score_max}")

    @model_validator(mode="after")
    def _check(self) -> "Config":
        if self.judge_model_server is None:
            raise ValueError("judge_model_server: missing (an instance name, "
                             "{type: responses_api_models, name: ...} or a URL)")
        if self.score_max <= self.score_min:
            raise ValueError("score_max: must be above score_min")
        if isinstance(self.rubric, list):
            _unique_names(self.rubric, "rubric")
        PromptTemplate(self.judge_prompt_template, self.judge_system_message, fields=JUDGE_FIELDS)
        return self


def _unique_names(items: list[RubricItem], where: str) -> None:
    names = [item.name for item in items]
    if not items or len(set(names)) != len(names):
        raise BadRequest(f"{where}: a rubric list needs at least one item and unique item names")


class RubricRequest(VerifyRequest):
    """`/verify` body: the model's response plus an optional per-row `rubric` and `expected_answer`."""

    rubric: Rubric | None = Field(None, description="this row's rubric (text or items); default: the option")
    expected_answer: str | None = Field(None, description="a reference answer shown to the judge")


class RubricReply(VerifyReply):
    """Adds `judge_scores` (the raw score per rubric item, or `rubric` for a text rubric) and
    `judge_evaluations` (one per judge question)."""

    judge_scores: dict[str, float] | None = None
    judge_evaluations: list[dict[str, Any]] | None = None


class LLMJudge(Environment):
    config_model = Config
    request_model = RubricRequest
    reply_model = RubricReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "Explain in one sentence "
                                                          "why the sky is blue."}]},
                   "rubric": "Mentions that air scatters short (blue) wavelengths of sunlight more than long ones."}
    example_answer = "Air molecules scatter blue light more strongly than red light (Rayleigh scattering)."
    description = "A judge model scores the response against a rubric; the score is normalized to [0, 1]."
    config: Config
    judge: Judge
    template: PromptTemplate

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.template = PromptTemplate(config.judge_prompt_template, config.judge_system_message, fields=JUDGE_FIELDS)

    async def startup(self) -> None:
        await super().startup()
        self.judge = Judge(self.config, metrics=self.metrics.judges if self.metrics else None)

    def rubric(self, request: VerifyRequest) -> Rubric:
        raw = request.field("rubric")
        if raw is None:
            if self.config.rubric is None:
                raise BadRequest("rubric: missing (give it in the row or as the environment's rubric option)")
            return self.config.rubric
        try:
            rubric = _RUBRIC.validate_python(raw)
        except ValidationError as exc:
            raise BadRequest(f"rubric: {describe_validation_error(exc)}") from None
        if isinstance(rubric, str) and not rubric.strip():
            raise BadRequest("rubric: empty")
        if isinstance(rubric, list):
            _unique_names(rubric, "rubric")
        return rubric

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        rubric = self.rubric(request)
        reference = request.field("expected_answer")
        if reference is not None and not isinstance(reference, str):
            raise BadRequest("expected_answer: must be a string")
        low, high = self.config.score_min, self.config.score_max
        values = {"question": question_text(request), "reference": reference or "", "response": request.text(),
                  "score_min": str(low), "score_max": str(high)}
        items = rubric if isinstance(rubric, list) else [RubricItem(name="rubric", criterion=rubric)]
        questions = [self.judge.ask(self.template.messages(**values, rubric=item.criterion), score(low, high))
                     for item in items]
        outcomes = await asyncio.gather(*questions, return_exceptions=True)
        done = [o for o in outcomes if isinstance(o, Evaluation)]
        records = [e.record() for e in done]
        for outcome in outcomes:
            if isinstance(outcome, JudgeFailure):
                outcome.evaluations = records + outcome.evaluations
                return judge_failed_reply(request, outcome)
            if isinstance(outcome, BaseException):
                raise outcome
        scores = {item.name: float(e.verdict) for item, e in zip(items, done)}
        total = sum(item.weight for item in items)
        normalized = {item.name: item.weight * (scores[item.name] - low) / (high - low) / total for item in items}
        if isinstance(rubric, str):
            return scored_reply(request, normalized["rubric"], judge_scores=scores, judge_evaluations=records)
        return scored_reply(request, components=normalized, judge_scores=scores, judge_evaluations=records)


def build(config: Config) -> FastAPI:
    return create_resource_app(LLMJudge(config))
