"""code_jaccard: NeMo RL's Code Jaccard similarity reward (token Jaccard x length ratio).

Cheap (linear set operations), so it runs inline on the event loop; response and
ground-truth sizes are bounded so one request cannot stall the loop.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import Field

from services.core.errors import BadRequest
from services.core.replies import scored_reply
from services.core.resource import Environment, ResourceConfig, Session, create_resource_app
from services.core.schemas import VerifyReply, VerifyRequest

from .scoring import ALIGNED_THRESHOLD, is_aligned, jaccard_score


class Config(ResourceConfig):
    use_pool: bool = Field(False, description="scoring is cheap and runs inline; no worker pool")
    aligned_threshold: float = Field(ALIGNED_THRESHOLD, ge=0.0, le=1.0,
                                     description="`aligned` is true when the score is at least this")
    max_response_chars: int = Field(200_000, gt=0,
                                    description="longer responses get reward 0.0 with a reason, unscored")
    max_ground_truth_chars: int = Field(500_000, gt=0, description="longer ground truths are a 400")


def ground_truth_of(request: VerifyRequest) -> str:
    """`expected_answer`, else `ground_truth` (NeMo RL's metadata name); a 400 when neither is a string."""
    for name in ("expected_answer", "ground_truth"):
        value = request.field(name)
        if value is not None:
            if not isinstance(value, str):
                raise BadRequest(f"{name}: expected a string, got {type(value).__name__}")
            return value
    raise BadRequest("expected_answer: missing (the row needs expected_answer or ground_truth, a string)")


class CodeJaccardRequest(VerifyRequest):
    expected_answer: str | None = Field(None, description="the reference code (or `ground_truth`)")
    ground_truth: str | None = Field(None, description="NeMo RL's name for expected_answer")


class CodeJaccardReply(VerifyReply):
    aligned: bool | None = Field(None, description="score >= aligned_threshold")
    reward_reason: str | None = Field(None, description="why a response was not scored (too long)")


class CodeJaccard(Environment):
    reverify_mode = "stateless"  # /verify is a pure function of its body
    config_model = Config
    request_model = CodeJaccardRequest
    reply_model = CodeJaccardReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "Write add(a, b)."}]},
                   "expected_answer": "def add(a, b):\n    return a + b"}
    example_answer = "def add(a, b):\n    return a + b"
    description = "Reward = NeMo RL Code Jaccard similarity of the response to expected_answer."
    config: Config

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        truth = ground_truth_of(request)
        if len(truth) > self.config.max_ground_truth_chars:
            raise BadRequest(f"expected_answer: {len(truth)} characters exceeds "
                             f"max_ground_truth_chars={self.config.max_ground_truth_chars}")
        text = request.text()
        extra: dict[str, Any] = {}
        if len(text) > self.config.max_response_chars:
            score = 0.0
            extra["reward_reason"] = (f"response of {len(text)} characters exceeds "
                                      f"max_response_chars={self.config.max_response_chars}; not scored")
        else:
            score = jaccard_score(text, truth)
        return scored_reply(request, score, aligned=is_aligned(score, self.config.aligned_threshold), **extra)


def build(config: Config) -> FastAPI:
    return create_resource_app(CodeJaccard(config))
