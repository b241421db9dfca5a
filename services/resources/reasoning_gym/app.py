"""reasoning_gym: procedurally generated reasoning tasks scored by the task's own `score_answer`.

Row fields: `reasoning_gym_entry` ({question, answer, metadata}) and `task_name`, as
`generate_rows` writes them; NeMo-Gym's rows (top-level `question`, `answer`, `metadata`
with `metadata.source_dataset`) work too. Scorers can be slow or hang (some build large
structures), so every score runs in the core worker pool under its deadline.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Literal

from fastapi import FastAPI
from pydantic import Field

from services.core.errors import BadRequest
from services.core.failures import FailureKind
from services.core.pool import TaskError, WorkerFailure
from services.core.replies import exception_reply, failed_reply, scored_reply
from services.core.resource import Environment, ResourceConfig, Session, create_resource_app
from services.core.schemas import VerifyReply, VerifyRequest

from .generate import task_names
from .scoring import score, warm_worker


class Config(ResourceConfig):
    answer_extraction: Literal["tags_then_boxed", "full_text"] = Field(
        "tags_then_boxed", description="<answer> tags, then \\boxed{}, then the whole text; or the whole text")
    max_response_chars: int = Field(200_000, gt=0,
                                    description="longer responses get reward 0.0 with a reason, unscored")


@functools.lru_cache(maxsize=1)
def _known_tasks() -> frozenset[str]:
    return frozenset(task_names())


def entry_and_task(request: VerifyRequest) -> tuple[dict[str, Any], str]:
    """The generator entry and task name of a row; a 400 naming what is missing or wrong."""
    entry = request.field("reasoning_gym_entry")
    if entry is None and request.field("metadata") is not None:  # NeMo-Gym's row shape
        entry = {"question": request.field("question"), "answer": request.field("answer"),
                 "metadata": request.field("metadata")}
    if entry is None:
        raise BadRequest("reasoning_gym_entry: missing (rows from `gymserve prepare reasoning-gym` carry it)")
    if not isinstance(entry, dict):
        raise BadRequest(f"reasoning_gym_entry: expected an object, got {type(entry).__name__}")
    metadata = entry.get("metadata")
    if not isinstance(metadata, dict):
        raise BadRequest("reasoning_gym_entry.metadata: missing or not an object")
    task = request.field("task_name") or metadata.get("source_dataset")
    if not isinstance(task, str) or not task:
        raise BadRequest("task_name: missing (and no metadata.source_dataset in the entry)")
    if task not in _known_tasks():
        raise BadRequest(f"task_name: unknown reasoning-gym task {task!r}")
    return entry, task


class ReasoningGymRequest(VerifyRequest):
    reasoning_gym_entry: dict[str, Any] | None = Field(
        None, description="the generator's {question, answer, metadata} (or NeMo-Gym's top-level fields)")
    task_name: str | None = Field(None, description="reasoning-gym task (default: metadata.source_dataset)")
    reasoning_gym_dataset: Any = Field(None, description="dataset options the scorer needs (some tasks)")


class ReasoningGymReply(VerifyReply):
    task_name: str | None = None
    score: float | None = None
    extracted_answer: str | None = None
    reward_reason: str | None = None


class ReasoningGym(Environment):
    reverify_mode = "stateless"  # /verify is a pure function of its body
    config_model = Config
    request_model = ReasoningGymRequest
    reply_model = ReasoningGymReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "60 + 93 - 16 + 19 ="}]},
                   "task_name": "chain_sum",
                   "reasoning_gym_entry": {"question": "60 + 93 - 16 + 19 =", "answer": "156",
                                           "metadata": {"source_dataset": "chain_sum", "source_index": 0}}}
    example_answer = "<answer>156</answer>"
    needs_pool = True
    description = "reasoning-gym tasks; reward = the task's own score_answer of the extracted answer."
    config: Config

    def worker_initializer(self) -> Callable[[], Any] | None:
        return warm_worker

    async def startup(self) -> None:
        _known_tasks()  # import reasoning_gym before the first request, not during it
        await super().startup()

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        entry, task = entry_and_task(request)
        text = request.text()
        if len(text) > self.config.max_response_chars:
            return scored_reply(request, 0.0, task_name=task, extracted_answer=None, reward_reason=(
                f"response of {len(text)} characters exceeds max_response_chars="
                f"{self.config.max_response_chars}; not scored"))
        try:
            value, answer = await self.in_pool(score, task, text, entry, self.config.answer_extraction,
                                               request.field("reasoning_gym_dataset"))
        except (WorkerFailure, TaskError) as exc:
            return exception_reply(request, exc, f"{task} scorer", task_name=task)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return failed_reply(request, FailureKind.CRASH, f"{task} scorer returned {value!r}", task_name=task)
        return scored_reply(request, value, score=value, task_name=task, extracted_answer=answer)


def build(config: Config) -> FastAPI:
    return create_resource_app(ReasoningGym(config))
