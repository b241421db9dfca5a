"""math: NeMo RL's math environment as a resource server.

Reward 1.0/0.0 from math-verify (`math_metric` semantics, see `checker.py`); the reply adds
`extracted_answer`. With `should_use_judge` (NeMo-Gym's `math_with_judge`), an answer that
math-verify does not find equal is shown to a judge model in both orders (`services/core/judge.py`).
Every check runs in the core worker pool: math-verify's SIGALRM timeouts only work in a process's
main thread, and the pool's hard deadline kills a worker that a pathological expression keeps busy
past it.
"""
from __future__ import annotations

import asyncio
from typing import Any, Literal, get_args

from fastapi import FastAPI
from pydantic import Field, model_validator

from services.core.errors import BadRequest
from services.core.failures import FailureKind
from services.core.judge import (Judge, JudgeConfig, JudgeFailure, PromptTemplate, equal_in_orders,
                                 judge_failed_reply, question_text)
from services.core.pool import TaskError, WorkerFailure
from services.core.replies import exception_reply, failed_reply, scored_reply
from services.core.resource import Environment, Session, create_resource_app
from services.core.schemas import VerifyReply, VerifyRequest

from . import checker

AnswerFormat = Literal["expression", "number"]
ANSWER_FORMATS: tuple[str, ...] = get_args(AnswerFormat)


# The judge's instructions (after Arena Hard's pairwise prompt, as NeMo-Gym's math_with_judge).
JUDGE_SYSTEM_MESSAGE = """You judge whether two answers to a math problem are mathematically equivalent. \
You are given assistant A's answer and assistant B's answer. Ignore formatting, wording and units \
notation; consider only whether both answers state the same mathematical value or object.

Finish with exactly one verdict label:
- the answers are equivalent: [[A=B]]
- the answers are different: [[A!=B]]

Example ending: "My final verdict is [[A!=B]]"."""
JUDGE_PROMPT_TEMPLATE = ("<|Problem|>\n{question}\n\n<|Start of Assistant A's Answer|>\n{first_answer}\n"
                         "<|End of Assistant A's Answer|>\n\n<|Start of Assistant B's Answer|>\n{second_answer}\n"
                         "<|End of Assistant B's Answer|>")
JUDGE_FIELDS = ("question", "first_answer", "second_answer")


class Config(JudgeConfig):
    should_use_judge: bool = Field(False, description="ask judge_model_server when math-verify says not equal "
                                                      "(NeMo-Gym's math_with_judge); off: math-verify alone")
    judge_system_message: str | None = Field(JUDGE_SYSTEM_MESSAGE, description="the judge's system message")
    judge_prompt_template: str = Field(JUDGE_PROMPT_TEMPLATE, description="the judge's user message; fields "
                                                                          "{question}, {first_answer}, {second_answer}")
    verify_deadline_s: float = Field(15.0, gt=0, description="hard deadline of one check in a worker (backstop)")
    math_verify_timeout_s: int = Field(5, ge=1, description="math-verify's own per-operation timeout (SIGALRM)")
    timeout_policy: Literal["zero", "mask"] = Field(
        "zero", description="a verifier timeout scores 0.0 (zero, NeMo RL's behaviour) or masks the sample")
    batch_chunk: int = Field(0, ge=0, description="/verify/batch items per pool call; 0 = auto (about four "
                                                   "chunks per worker, at most 32 items), 1 = one call per item")

    @model_validator(mode="after")
    def _judge(self) -> "Config":
        if self.should_use_judge and self.judge_model_server is None:
            raise ValueError("should_use_judge: needs judge_model_server (an instance name, "
                             "{type: responses_api_models, name: ...} or a URL)")
        PromptTemplate(self.judge_prompt_template, self.judge_system_message, fields=JUDGE_FIELDS)
        return self


def expected_answer(request: VerifyRequest) -> str:
    """The row's `expected_answer` as a string; numbers are accepted, anything else is the row's problem."""
    value = request.field("expected_answer")
    if value is None:
        value = request.field("ground_truth")  # NeMo RL's name for it
    if value is None:
        raise BadRequest("expected_answer: missing from the row (the reference answer; "
                         "ground_truth is accepted too)")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise BadRequest(f"expected_answer: must be a string or a number, got {type(value).__name__}")
    text = str(value)
    if not text.strip():
        raise BadRequest("expected_answer: empty string")
    return text  # unstripped, as NeMo RL uses it


def number_only(request: VerifyRequest) -> bool:
    """The row's `answer_format`: "number" scores only an answer written as a number, so that restating
    the question ("3 + 4") is not taken for its answer, as math-verify's expression matching would."""
    value = request.field("answer_format", "expression")
    if value not in ANSWER_FORMATS:
        raise BadRequest(f"answer_format: must be one of {', '.join(ANSWER_FORMATS)}, got {str(value)[:50]!r}")
    return value == "number"


def balanced_braces(expected: str) -> str:
    """`expected` unchanged if its braces balance (escaped `\\{`, `\\}` aside); else a 400. Unbalanced
    braces break the `\\boxed{...}` that the gold is wrapped in: math-verify would quietly fall back to
    comparing broken strings and the row could never score."""
    depth = 0
    i = 0
    while i < len(expected):
        char = expected[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth < 0:
                break
        i += 1
    if depth != 0:
        raise BadRequest(f"expected_answer: {expected[:200]!r} is not parsable by math-verify (unbalanced braces)")
    return expected


def last_boxed(text: str) -> str | None:
    """The contents of the last complete `\\boxed{...}` (what the judge compares), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 1, start + len("\\boxed{")
    for i in range(begin, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
    return None


class MathReply(VerifyReply):
    """A verify reply that always carries `extracted_answer` (null when nothing was extracted); with the
    judge on, also math-verify's own `library_reward` and the judge's `judge_evaluations` (null when the
    judge was not asked)."""

    extracted_answer: str | None = None
    library_reward: float | None = None
    judge_evaluations: list[dict[str, Any]] | None = None

    def dump(self) -> dict[str, Any]:
        out = super().dump()
        out.setdefault("extracted_answer", None)
        return out


class MathRequest(VerifyRequest):
    expected_answer: str | int | float | None = Field(None, description="the reference answer (or ground_truth)")
    ground_truth: str | int | float | None = Field(None, description="NeMo RL's name for expected_answer")
    answer_format: AnswerFormat = Field(
        "expression", description="expression: any answer math-verify finds equal (NeMo RL's behaviour); "
                                  "number: the answer must be written as a number")


class MathEnvironment(Environment):
    config_model = Config
    request_model = MathRequest
    reply_model = MathReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "What is 17 + 25?"}]},
                   "expected_answer": "42"}
    example_answer = "17 + 25 = \\boxed{42}"
    needs_pool = True
    description = "Reward 1.0 when math-verify finds the response's answer equal to expected_answer."
    config: Config
    judge: Judge | None = None
    judge_template: PromptTemplate

    async def startup(self) -> None:
        await super().startup()
        if self.config.should_use_judge:
            self.judge = Judge(self.config, metrics=self.metrics.judges if self.metrics else None)
            self.judge_template = PromptTemplate(self.config.judge_prompt_template, self.config.judge_system_message,
                                                 fields=JUDGE_FIELDS)

    async def judged(self, request: VerifyRequest, reply: VerifyReply) -> VerifyReply:
        """math-verify's reply, or the judge's when math-verify said not equal (NeMo-Gym's math_with_judge:
        reward 1 only when the judge says equal in both orders; no `\\boxed{}` answer, no judge)."""
        if self.judge is None or reply.mask_sample or reply.failure_kind is not None:
            return reply
        library_reward = reply.reward
        extracted = getattr(reply, "extracted_answer", None)
        boxed = last_boxed(request.text())
        if library_reward > 0.5 or boxed is None or not boxed.strip():
            return scored_reply(request, library_reward, model=MathReply, extracted_answer=extracted,
                                library_reward=library_reward)
        expected = expected_answer(request)
        question = question_text(request)
        orders = [{"question": question, "first_answer": expected, "second_answer": boxed},
                  {"question": question, "first_answer": boxed, "second_answer": expected}]
        try:
            equal, evaluations = await equal_in_orders(self.judge, self.judge_template, orders)
        except JudgeFailure as exc:
            return judge_failed_reply(request, exc, extracted_answer=extracted, library_reward=library_reward)
        return scored_reply(request, 1.0 if equal else 0.0, model=MathReply, extracted_answer=extracted,
                            library_reward=library_reward, judge_evaluations=evaluations)

    def worker_initializer(self) -> Any:
        return checker.init_worker

    def reply(self, request: VerifyRequest, expected: str, outcome: tuple[float, str | None, str]) -> VerifyReply:
        reward, extracted, status = outcome
        if status == checker.BAD_GOLD:
            raise BadRequest(f"expected_answer: {expected[:200]!r} is not parsable by math-verify "
                             "(no answer can be extracted from \\boxed{expected_answer})")
        if status == checker.TIMEOUT:
            return self.timed_out(request, "math-verify timed out on this response", extracted)
        return scored_reply(request, reward, model=MathReply, extracted_answer=extracted)

    def timed_out(self, request: VerifyRequest, reason: str, extracted: str | None = None) -> VerifyReply:
        return failed_reply(request, FailureKind.TIMEOUT, reason, mask=self.config.timeout_policy == "mask",
                            model=MathReply, extracted_answer=extracted)

    def failure(self, request: VerifyRequest, exc: Exception) -> VerifyReply:
        if isinstance(exc, WorkerFailure) and exc.kind == FailureKind.TIMEOUT:
            return self.timed_out(request, f"verifier {exc}")
        return exception_reply(request, exc, "math-verify", model=MathReply)

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        expected = balanced_braces(expected_answer(request))
        try:
            outcome = await self.in_pool(checker.score, request.text(), expected, self.config.math_verify_timeout_s,
                                         number_only(request))
        except (WorkerFailure, TaskError) as exc:
            return self.failure(request, exc)
        return await self.judged(request, self.reply(request, expected, outcome))

    async def verify_many(self, requests: list[VerifyRequest]) -> list[VerifyReply]:
        if self.pool is None:  # item by item through `verify`, which asks the judge itself
            return await super().verify_many(requests)
        replies = await self._verify_many(requests)
        if self.judge is None:
            return replies
        # judge questions of a batch go out concurrently: the judge's server batches them
        return list(await asyncio.gather(*(self.judged(r, reply) for r, reply in zip(requests, replies))))

    async def _verify_many(self, requests: list[VerifyRequest]) -> list[VerifyReply]:
        """Chunks of items per pool call (less IPC and bookkeeping per item than one call each);
        a chunk that times out or crashes is re-run item by item, so only the culprit fails."""
        assert self.pool is not None
        replies: list[VerifyReply | None] = [None] * len(requests)
        work: list[tuple[int, str, bool]] = []
        for i, request in enumerate(requests):
            try:  # a bad expected_answer or answer_format fails this item alone
                work.append((i, balanced_braces(expected_answer(request)), number_only(request)))
            except BadRequest as exc:
                replies[i] = exception_reply(request, exc, model=MathReply)
        if self.config.batch_chunk == 1:
            await self._run_each(requests, work, replies)
            return [r for r in replies if r is not None]
        size = self.config.batch_chunk or max(1, min(32, -(-len(work) // (4 * self.pool.size))))
        chunks = [work[k:k + size] for k in range(0, len(work), size)]
        await asyncio.gather(*(self._run_chunk(requests, chunk, replies) for chunk in chunks))
        return [r for r in replies if r is not None]

    async def _run_chunk(self, requests: list[VerifyRequest], chunk: list[tuple[int, str, bool]],
                         replies: list[VerifyReply | None]) -> None:
        """One pool call for the chunk; if it fails (a pathological item), each item runs alone."""
        timeout_s = self.config.math_verify_timeout_s
        args = [(requests[i].text(), expected, number) for i, expected, number in chunk]
        try:
            # room for one slow item; a chunk stuck longer is re-run item by item below
            outcomes = await self.in_pool(checker.score_many, args, timeout_s,
                                          deadline_s=2 * self.config.verify_deadline_s)
        except (WorkerFailure, TaskError):
            await self._run_each(requests, chunk, replies)
            return
        for (i, expected, _), outcome in zip(chunk, outcomes):
            replies[i] = self._safe_reply(requests[i], expected, outcome)

    async def _run_each(self, requests: list[VerifyRequest], work: list[tuple[int, str, bool]],
                        replies: list[VerifyReply | None]) -> None:
        """One pool item per request through `pool.map`: each has its own deadline."""
        assert self.pool is not None
        timeout_s = self.config.math_verify_timeout_s
        outcomes = await self.pool.map(checker.score, [(requests[i].text(), expected, timeout_s, number)
                                                       for i, expected, number in work])
        for (i, expected, _), outcome in zip(work, outcomes):
            if isinstance(outcome, BaseException):
                replies[i] = self.failure(requests[i], outcome)
            else:
                replies[i] = self._safe_reply(requests[i], expected, outcome)

    def _safe_reply(self, request: VerifyRequest, expected: str, outcome: tuple[float, str | None, str]) -> VerifyReply:
        try:
            return self.reply(request, expected, outcome)
        except BadRequest as exc:
            return exception_reply(request, exc, model=MathReply)


def build(config: Config) -> FastAPI:
    return create_resource_app(MathEnvironment(config))
