"""instruction_following: IFEval-style verifiable instructions.

Row fields (IFEval's): `instruction_id_list` and a parallel `kwargs` list, top-level or in
NeMo-Gym's `verifier_metadata` (nemo_format.py). The reply adds
`instruction_results: [{id, passed}]` plus NeMo-Gym's `follow_all_instructions` and
`follow_instruction_list`. Short responses with regex-only checks run inline; language
detection, NLTK tokenizing and long responses run in the worker pool under its deadline. The
instruction ids are IFEval's, open-instruct's and IFBench's (checks.py REGISTRY).
"""
from __future__ import annotations

from typing import Any, Callable, Literal

from fastapi import FastAPI
from pydantic import BaseModel, Field

from services.core.errors import BadRequest
from services.core.pool import TaskError, WorkerFailure
from services.core.replies import exception_reply, scored_reply
from services.core.resource import Environment, ResourceConfig, Session, create_resource_app
from services.core.schemas import VerifyReply, VerifyRequest

from . import nemo_format
from .checks import InstructionError, check_row, needs_slow_path, parse_row
from .text import detect_language, nltk_words


class Config(ResourceConfig):
    workers: int = Field(1, ge=0, description="worker processes for language detection and long responses")
    reward_mode: Literal["all", "fraction"] = Field(
        "all", description="all: 1.0 only if every instruction passes; fraction: the share that pass")
    strictness: Literal["strict", "loose"] = Field(
        "strict", description="loose also accepts the response minus first/last line or without asterisks")
    inline_max_work: int = Field(
        50_000, ge=0, description="checks run inline while characters x instructions x variants (1 strict, 8 loose) "
        "stays under this (about 2 ms); bigger jobs and language detection go to the worker pool")
    max_instructions: int = Field(64, gt=0, description="rows with more instructions are a 400")


def warm_worker() -> None:
    """Load langdetect's language profiles, NLTK's tokenizer and syllapy's dictionary once per
    worker, not on the first request."""
    import syllapy

    detect_language("warm up the language profiles")
    nltk_words("Warm up the tokenizer.")
    syllapy.count("warm")


class InstructionFollowingRequest(VerifyRequest):
    instruction_id_list: list[str] | None = Field(
        None, description="IFEval instruction ids, e.g. punctuation:no_comma (here or in verifier_metadata)")
    kwargs: list[dict[str, Any] | None] | None = Field(None, description="arguments of each instruction, in order")
    verifier_metadata: dict[str, Any] | None = Field(
        None, description="NeMo-Gym's row format: instruction_id_list, kwargs, grading_mode (binary or fraction)")


class InstructionResult(BaseModel):
    id: str
    passed: bool


class InstructionFollowingReply(VerifyReply):
    instruction_results: list[InstructionResult] | None = None
    follow_all_instructions: bool | None = None
    follow_instruction_list: list[bool] | None = None
    strictness: str | None = None


class InstructionFollowing(Environment):
    reverify_mode = "stateless"  # /verify is a pure function of its body
    config_model = Config
    request_model = InstructionFollowingRequest
    reply_model = InstructionFollowingReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "A poem, no commas."}]},
                   "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
    example_answer = "the sea is wide and blue"
    needs_pool = True
    description = "IFEval verifiable instructions; reward = all-or-nothing or the fraction followed."
    config: Config

    def worker_initializer(self) -> Callable[[], Any] | None:
        return warm_worker

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        row = nemo_format.row_fields(request)
        ids, kwargs = row["instruction_id_list"], row["kwargs"]
        if ids is None:
            raise BadRequest("instruction_id_list: missing (the row needs IFEval's instruction_id_list and kwargs)")
        if isinstance(ids, list) and len(ids) > self.config.max_instructions:
            raise BadRequest(f"instruction_id_list: {len(ids)} instructions exceeds "
                             f"max_instructions={self.config.max_instructions}")
        try:
            pairs = parse_row(ids, kwargs)
        except InstructionError as exc:
            raise BadRequest(str(exc)) from None
        text = nemo_format.final_text(request.response) if row["nemo"] else request.text()
        mode = row["reward_mode"] or self.config.reward_mode
        loose = self.config.strictness == "loose"
        work = len(text) * len(pairs) * (8 if loose else 1)
        if needs_slow_path(pairs) or work > self.config.inline_max_work:
            try:
                passed = await self.in_pool(check_row, text, pairs, loose)
            except (WorkerFailure, TaskError) as exc:
                return exception_reply(request, exc, "instruction checks")
        else:
            passed = check_row(text, pairs, loose)
        all_passed = all(passed)
        reward = float(all_passed) if mode == "all" else sum(passed) / len(passed)
        return scored_reply(
            request, reward,
            instruction_results=[InstructionResult(id=iid, passed=ok) for (iid, _), ok in zip(pairs, passed)],
            follow_all_instructions=all_passed, follow_instruction_list=passed,
            strictness=self.config.strictness,
        )


def build(config: Config) -> FastAPI:
    return create_resource_app(InstructionFollowing(config))
