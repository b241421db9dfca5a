"""Pydantic models of the wire format (NeMo-Gym's: rows, verify bodies and replies; see docs/architecture.md).

Every model keeps unknown fields (`extra="allow"`) because NeMo-Gym rows carry
arbitrary task fields that must be echoed back unchanged.
"""
from __future__ import annotations

import math
import time
import uuid
from typing import Annotated, Any, Iterable, Literal, Union

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, RootModel, Tag, ValidationInfo, field_validator,
                      model_validator)

from .content import content_problem, content_text, item_problem
from .failures import FAILURE_KINDS, FailureKind  # noqa: F401  (re-exported: part of the wire contract)


def _raise_first(problems: Iterable[str | None]) -> None:
    """A validation error naming the first badly typed part (its path inside the field), if any."""
    for problem in problems:
        if problem:
            raise ValueError(problem)


class WireModel(BaseModel):
    """Base of every wire model: extra fields kept and echoed."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


# --------------------------------------------------------------------------- #
# Dataset rows
# --------------------------------------------------------------------------- #
class AgentRef(WireModel):
    type: str = "responses_api_agents"
    name: str


class ResponsesCreateParams(WireModel):
    """The body of an OpenAI `responses.create` call (only the fields we read are typed)."""

    input: Union[str, list[dict[str, Any]]] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    instructions: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _typed_items(cls, value: Any) -> Any:
        if isinstance(value, list):
            _raise_first(item_problem(item, f"input[{i}]") for i, item in enumerate(value))
        return value

    def input_messages(self) -> list[dict[str, Any]]:
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return list(self.input)


class DatasetRow(WireModel):
    """One JSONL line of a dataset, and the body of agent `POST /run`."""

    responses_create_params: ResponsesCreateParams
    agent_ref: AgentRef | None = None


# --------------------------------------------------------------------------- #
# Responses API items (only the ones we use; unknown item types pass through)
# --------------------------------------------------------------------------- #
class TrainingTokens(WireModel):
    """Training token data a model server attaches to the last output item of a call."""

    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float] | None = None


class OutputText(WireModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)


class MessageItem(TrainingTokens):
    type: Literal["message"] = "message"
    id: str = Field(default_factory=lambda: f"msg_{uuid.uuid4().hex[:24]}")
    role: str = "assistant"
    status: str | None = "completed"
    content: Union[str, list[dict[str, Any]]] = Field(default_factory=list)

    @field_validator("content", mode="before")
    @classmethod
    def _typed_parts(cls, value: Any) -> Any:
        _raise_first([content_problem(value, "content")])
        return value

    def text(self) -> str:
        return content_text(self.content)


class FunctionCallItem(TrainingTokens):
    type: Literal["function_call"] = "function_call"
    id: str = Field(default_factory=lambda: f"fc_{uuid.uuid4().hex[:24]}")
    call_id: str = Field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    name: str
    arguments: str = "{}"
    status: str | None = "completed"


class FunctionCallOutputItem(WireModel):
    type: Literal["function_call_output"] = "function_call_output"
    call_id: str
    output: str


class ReasoningItem(TrainingTokens):
    type: Literal["reasoning"] = "reasoning"
    id: str = Field(default_factory=lambda: f"rs_{uuid.uuid4().hex[:24]}")
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[dict[str, Any]] | None = None

    @field_validator("summary", "content", mode="before")
    @classmethod
    def _typed_parts(cls, value: Any, info: ValidationInfo) -> Any:
        _raise_first([content_problem(value, str(info.field_name))])
        return value


class OtherItem(WireModel):
    """Any item type we do not model: kept as-is."""

    type: str | None = None


_KNOWN_ITEMS = {"message", "function_call", "function_call_output", "reasoning"}


def _item_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if kind is None and isinstance(value, dict) and "role" in value:
        kind = "message"  # easy-input messages {"role", "content"} have no type
    return kind if isinstance(kind, str) and kind in _KNOWN_ITEMS else "other"


ResponseItem = Annotated[
    Union[
        Annotated[MessageItem, Tag("message")],
        Annotated[FunctionCallItem, Tag("function_call")],
        Annotated[FunctionCallOutputItem, Tag("function_call_output")],
        Annotated[ReasoningItem, Tag("reasoning")],
        Annotated[OtherItem, Tag("other")],
    ],
    Discriminator(_item_tag),
]


class Usage(WireModel):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


class ResponseObject(WireModel):
    """An OpenAI Responses API response object."""

    id: str = Field(default_factory=lambda: f"resp_{uuid.uuid4().hex[:24]}")
    object: str = "response"
    created_at: float = Field(default_factory=time.time)
    model: str | None = None
    status: str | None = "completed"
    output: list[ResponseItem] = Field(default_factory=list)
    usage: Usage | None = None
    incomplete_details: dict[str, Any] | None = None

    def output_text(self) -> str:
        """Concatenated `output_text` parts of the assistant message items."""
        return response_text(self)


def response_text(response: ResponseObject | dict[str, Any]) -> str:
    """The text an environment judges: assistant message `output_text` parts, concatenated."""
    items = response.output if isinstance(response, ResponseObject) else response.get("output") or []
    parts: list[str] = []
    for item in items:
        if isinstance(item, MessageItem):
            if item.role == "assistant":
                parts.append(item.text())
        elif isinstance(item, dict) and item.get("type", "message") == "message" and item.get("role", "assistant") == "assistant":
            parts.append(MessageItem.model_validate(item).text())
    return "".join(parts)


# --------------------------------------------------------------------------- #
# Verification
# --------------------------------------------------------------------------- #
class VerifyRequest(WireModel):
    """`POST /verify` body: the row's fields plus the model's `response`."""

    responses_create_params: ResponsesCreateParams = Field(default_factory=ResponsesCreateParams)
    response: ResponseObject

    def text(self) -> str:
        return response_text(self.response)

    def field(self, name: str, default: Any = None) -> Any:
        """A task field of the row (extra fields are not attributes)."""
        return (self.model_extra or {}).get(name, default)


class VerifyReply(VerifyRequest):
    """`POST /verify` reply: the request echoed back plus the reward fields.

    A failure for an infrastructure reason is never a fabricated 0: it carries
    `mask_sample=True` and a `failure_kind` so trainers drop the sample.
    """

    reward: float = Field(0.0, description="the verdict; the sum of reward_components when those are given")
    reward_components: dict[str, float] | None = Field(None, description="named parts of a multi-part reward")
    mask_sample: bool = Field(False, description="true: the sample could not be judged; trainers drop it")
    failure_kind: FailureKind | None = Field(None, description="why it could not be judged (with mask_sample)")
    failure_reason: str | None = Field(None, description="a human-readable reason for the failure")

    @field_validator("reward")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("reward must be a finite number")
        return value

    @model_validator(mode="after")
    def _components_sum(self) -> "VerifyReply":
        if self.reward_components:
            self.reward = float(sum(self.reward_components.values()))
        return self


# --------------------------------------------------------------------------- #
# Session and metrics endpoints of a resource server
# --------------------------------------------------------------------------- #
class SeedSessionReply(WireModel):
    """`POST /seed_session` reply: the server-issued session id (also set as cookie and X-Session-Id header) plus
    what the environment reports about the new session. A NeMo-Gym Environment-Server seed (one naming
    `resources_session_id`) is answered with that name only; its session id travels in the header and cookie."""

    session_id: str | None = Field(None, description="the session's id, issued by the server")
    resources_session_id: str | None = Field(None, description="the caller's name for the session (NeMo-Gym)")


class CloseSessionRequest(WireModel):
    session_id: str | None = Field(None, description="when neither the X-Session-Id header nor the cookie is sent")
    resources_session_id: str | None = Field(None, description="close by the caller's name for the session (NeMo-Gym)")


class CloseSessionReply(WireModel):
    session_id: str | None = None
    closed: bool | None = Field(None, description="false when the session was unknown (already closed or expired)")
    resources_session_id: str | None = Field(None, description="the name closed (NeMo-Gym close)")


class RolloutReply(VerifyReply):
    """Agent `POST /run` reply: the resource server's verify reply plus how the rollout went."""

    num_turns: int | None = Field(None, description="model calls made")
    session_id: str | None = Field(None, description="the resource server session the rollout used")
    stop_reason: str | None = Field(None, description="why the loop ended (e.g. no_tool_calls, max_turns)")


class VerifyResponses(WireModel):
    verify_responses: list[dict[str, Any]]


class AggregateRequest(RootModel[Union[list[dict[str, Any]], VerifyResponses]]):
    """`POST /aggregate_metrics` body: verify replies, as a list or under `verify_responses`."""


def example_verify_body(row: dict[str, Any], answer: str) -> dict[str, Any]:
    """A `/verify` body for the docs: the row (without its routing) and a response saying `answer`."""
    body = {k: v for k, v in row.items() if k != "agent_ref"}
    body["response"] = {
        "id": "resp_example", "object": "response", "created_at": 1700000000.0, "model": "policy",
        "status": "completed",
        "output": [{"type": "message", "id": "msg_example", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": answer, "annotations": []}]}]}
    return body
