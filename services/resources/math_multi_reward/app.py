"""math_multi_reward: GDPO-style multi-reward math (correctness + integer + format).

Reply: `reward_components` {correctness, integer, format} and `reward` = their sum, plus
`extracted_answer`. Option `correctness: math_verify` judges correctness by math-verify
equivalence in the core worker pool instead of string equality.
"""
from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from pydantic import Field

from services.core.errors import BadRequest
from services.core.failures import FailureKind
from services.core.pool import TaskError, WorkerFailure
from services.core.replies import exception_reply, scored_reply
from services.core.resource import Environment, ResourceConfig, Session, create_resource_app
from services.core.schemas import VerifyReply, VerifyRequest
from services.resources.math import checker
from services.resources.math.app import MathRequest, balanced_braces, expected_answer

from . import scoring


class Config(ResourceConfig):
    correctness: Literal["string", "math_verify"] = Field(
        "string", description="string: answer == expected_answer (NeMo RL's GDPO example); "
                              "math_verify: math-verify equivalence of the two, in the worker pool")
    verify_deadline_s: float = Field(15.0, gt=0, description="hard deadline of one math-verify check")
    math_verify_timeout_s: int = Field(5, ge=1, description="math-verify's own per-operation timeout")
    timeout_policy: Literal["zero", "mask"] = Field("zero", description="a math-verify timeout scores "
                                                    "correctness 0 (zero) or masks the sample")


class MathMultiRewardReply(VerifyReply):
    extracted_answer: str | None = Field(None, description="the text inside <answer> tags")


class MathMultiReward(Environment):
    config_model = Config
    request_model = MathRequest
    reply_model = MathMultiRewardReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "What is 40 + 2?"}]},
                   "expected_answer": "42"}
    example_answer = "<think>\nadd\n</think>\n<answer>\n42\n</answer>"
    description = "GDPO multi-reward math: correctness + integer answer + <think>/<answer> format."
    config: Config

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        # the pool is only needed (and started) for math-verify correctness
        self.needs_pool = config.correctness == "math_verify"

    def worker_initializer(self) -> Any:
        return checker.init_worker

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        expected = expected_answer(request)
        text = request.text()
        answer = scoring.extract_answer(text)
        parts = {"correctness": 0.0, "integer": scoring.integer(answer), "format": scoring.format_ok(text)}
        failure: tuple[FailureKind, str, bool] | None = None
        if self.config.correctness == "string":
            parts["correctness"] = scoring.correctness(answer, expected)
        else:
            balanced_braces(expected)
            try:
                reward, _, status = await self.in_pool(checker.score, scoring.boxed(answer), expected,
                                                       self.config.math_verify_timeout_s)
            except (WorkerFailure, TaskError) as exc:
                if not isinstance(exc, WorkerFailure) or exc.kind != FailureKind.TIMEOUT:
                    return exception_reply(request, exc, "math-verify")
                status, reward = checker.TIMEOUT, 0.0
            if status == checker.BAD_GOLD:
                raise BadRequest(f"expected_answer: {expected[:200]!r} is not parsable by math-verify")
            parts["correctness"] = reward
            if status == checker.TIMEOUT:
                failure = (FailureKind.TIMEOUT, "math-verify timed out on this answer",
                           self.config.timeout_policy == "mask")
        return scored_reply(request, components=parts, failure=failure, extracted_answer=answer)


def build(config: Config) -> FastAPI:
    return create_resource_app(MathMultiReward(config))
