"""genrm_compare: a pairwise generative reward model. A judge model compares two responses to the same
prompt, in both orders (judges favour one position), and wins become rewards.

`POST /verify/batch` with a GRPO group (items sharing `group_id`, or else the same prompt) compares
every pair of the group: an item's reward is its share of the points it could win (a win is 1, a tie
0.5 per question), so the group's rewards rank its responses. A single `/verify` (or an item alone
in its group) is compared with the row's `reference_response`. Beside `reward_model`
(Bradley-Terry, one scalar per response), this needs no trained reward head: any instruct model judges.
"""
from __future__ import annotations

import asyncio
import json
from itertools import combinations
from typing import Any

from fastapi import FastAPI
from pydantic import Field, model_validator

from services.core.errors import BadRequest
from services.core.judge import (Evaluation, judge_failed_reply, JudgedEnvironment, JudgeFailure, label_parser,
                                 PromptTemplate, question_text, TemplatedJudgeConfig)
from services.core.replies import exception_reply, scored_reply
from services.core.resource import Session, create_resource_app
from services.core.schemas import VerifyReply, VerifyRequest

A_WINS, B_WINS, TIE = "[[A>B]]", "[[B>A]]", "[[A=B]]"
JUDGE_SYSTEM_MESSAGE = """You compare two assistant responses to the same user request and decide which \
is better: more correct, more helpful, and following the request's instructions. Ignore the order in \
which they are shown and their length as such. Explain briefly, then end with exactly one verdict label:
- response A is better: [[A>B]]
- response B is better: [[B>A]]
- they are equally good: [[A=B]]"""
JUDGE_PROMPT_TEMPLATE = ("<|User request|>\n{question}\n\n<|Response A|>\n{response_a}\n<|End of response A|>\n\n"
                         "<|Response B|>\n{response_b}\n<|End of response B|>")
JUDGE_FIELDS = ("question", "response_a", "response_b")
EXAMPLE_JUDGE_REPLY = "Equally good. [[A=B]]"  # what `gymserve check`'s scripted judge answers


class Config(TemplatedJudgeConfig):
    judge_system_message: str | None = Field(JUDGE_SYSTEM_MESSAGE, description="the judge's system message")
    judge_prompt_template: str = Field(JUDGE_PROMPT_TEMPLATE, description="the judge's user message; fields "
                                                                          "{question}, {response_a}, {response_b}")
    max_group_size: int = Field(16, ge=2, le=64, description="largest group compared pairwise (n·(n-1) questions)")

    @model_validator(mode="after")
    def _check(self) -> "Config":
        if self.judge_model_server is None:
            raise ValueError("judge_model_server: missing (an instance name, "
                             "{type: responses_api_models, name: ...} or a URL)")
        PromptTemplate(self.judge_prompt_template, self.judge_system_message, fields=JUDGE_FIELDS)
        return self


class CompareRequest(VerifyRequest):
    """`/verify` body: the response, plus `reference_response` (single verify) or `group_id` (batch)."""

    reference_response: str | None = Field(None, description="the baseline a single /verify is compared with")
    group_id: str | int | None = Field(None, description="batch items with the same group_id are compared; "
                                                         "default: items with the same prompt")


class CompareReply(VerifyReply):
    """Adds `genrm_points` (points won), `genrm_questions` (judge questions about it) and `judge_evaluations`."""

    genrm_points: float | None = None
    genrm_questions: int | None = None
    judge_evaluations: list[dict[str, Any]] | None = None


def points(verdict: str) -> tuple[float, float]:
    """Points of (response A, response B) for one verdict."""
    return {A_WINS: (1.0, 0.0), B_WINS: (0.0, 1.0)}.get(verdict, (0.5, 0.5))


class GenRMCompare(JudgedEnvironment):
    config_model = Config
    request_model = CompareRequest
    reply_model = CompareReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "Name a prime number "
                                                          "between 10 and 20."}]},
                   "reference_response": "15"}
    example_answer = "13"
    description = "A judge model compares responses pairwise (both orders); wins become rewards."
    config: Config
    judge_fields = JUDGE_FIELDS
    reward_scope = "group"  # the trainer client re-scores each GRPO group through /verify/batch

    async def compare(self, question: str, a: str, b: str) -> Evaluation:
        messages = self.template.messages(question=question, response_a=a, response_b=b)
        return await self.judge.ask(messages, label_parser(A_WINS, B_WINS, TIE))

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        reference = request.field("reference_response")
        if not isinstance(reference, str) or not reference.strip():
            raise BadRequest("reference_response: missing or empty (a single /verify compares the response with "
                             "it; send a group of responses to /verify/batch to compare them with each other)")
        question, text = question_text(request), request.text()
        try:
            first, second = await asyncio.gather(self.compare(question, text, reference),
                                                 self.compare(question, reference, text))
        except JudgeFailure as exc:
            return judge_failed_reply(request, exc)
        won = points(first.verdict)[0] + points(second.verdict)[1]
        return scored_reply(request, won / 2, genrm_points=won, genrm_questions=2,
                            judge_evaluations=[first.record(), second.record()])

    async def verify_many(self, requests: list[VerifyRequest]) -> list[VerifyReply]:
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            group = request.field("group_id")
            key = f"id:{group}" if group is not None else "prompt:" + json.dumps(
                request.responses_create_params.input_messages(), sort_keys=True, default=str)
            groups.setdefault(key, []).append(i)
        replies: list[VerifyReply | None] = [None] * len(requests)

        async def run(members: list[int]) -> None:
            if len(members) == 1:
                replies[members[0]] = await self.safe_verify(requests[members[0]], None)
                return
            for i, reply in zip(members, await self.compare_group([requests[i] for i in members])):
                replies[i] = reply

        await asyncio.gather(*(run(members) for members in groups.values()))
        return [r for r in replies if r is not None]

    async def compare_group(self, group: list[VerifyRequest]) -> list[VerifyReply]:
        """Every pair in both orders; one failed judge question masks the whole group (its rewards are
        relative to each other)."""
        if len(group) > self.config.max_group_size:
            error = BadRequest(f"group_id: a group of {len(group)} exceeds max_group_size={self.config.max_group_size}")
            return [exception_reply(r, error) for r in group]
        question, texts = question_text(group[0]), [r.text() for r in group]
        pairs = [(i, j) for i, j in combinations(range(len(group)), 2)]
        asks = [self.compare(question, texts[a], texts[b]) for i, j in pairs for a, b in ((i, j), (j, i))]
        outcomes = await asyncio.gather(*asks, return_exceptions=True)
        failure = next((o for o in outcomes if isinstance(o, BaseException)), None)
        if failure is not None:
            if not isinstance(failure, JudgeFailure):
                raise failure
            return [judge_failed_reply(r, failure) for r in group]
        won = [0.0] * len(group)
        records: list[list[dict[str, Any]]] = [[] for _ in group]
        orders = [(a, b) for i, j in pairs for a, b in ((i, j), (j, i))]
        for (a, b), evaluation in zip(orders, outcomes):
            assert isinstance(evaluation, Evaluation)
            got_a, got_b = points(evaluation.verdict)
            won[a] += got_a
            won[b] += got_b
            records[a].append(evaluation.record())
            records[b].append(evaluation.record())
        possible = 2 * (len(group) - 1)
        return [scored_reply(r, won[k] / possible, genrm_points=won[k], genrm_questions=possible,
                             judge_evaluations=records[k]) for k, r in enumerate(group)]


def build(config: Config) -> FastAPI:
    return create_resource_app(GenRMCompare(config))
