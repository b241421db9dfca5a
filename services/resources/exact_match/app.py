"""exact_match: reward 1 when the response equals `expected_answer` (after stripping).

The smallest complete environment: copy this folder to start a new one.
"""
from __future__ import annotations

from fastapi import FastAPI
from pydantic import Field

from services.core.errors import BadRequest
from services.core.replies import scored_reply
from services.core.resource import Environment, ResourceConfig, Session, create_resource_app
from services.core.schemas import VerifyReply, VerifyRequest


class Config(ResourceConfig):
    case_sensitive: bool = Field(False, description="compare with case")


class ExactMatchRequest(VerifyRequest):
    """`/verify` body of exact_match: the row's `expected_answer` and the model's response."""

    expected_answer: str = Field(description="the reference answer (compared after stripping)")


class ExactMatch(Environment):
    reverify_mode = "stateless"  # /verify is a pure function of its body
    config_model = Config
    request_model = ExactMatchRequest
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "Capital of France? One word."}]},
                   "expected_answer": "Paris"}
    example_answer = "Paris"
    description = "Reward 1.0 when the response text equals expected_answer."

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        expected = request.field("expected_answer")
        if not isinstance(expected, str):
            raise BadRequest("expected_answer: missing or not a string")
        got = request.text().strip()
        want = expected.strip()
        if not self.config.case_sensitive:
            got, want = got.lower(), want.lower()
        return scored_reply(request, float(got == want))


def build(config: Config) -> FastAPI:
    return create_resource_app(ExactMatch(config))
