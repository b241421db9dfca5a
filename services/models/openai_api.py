"""OpenAI wire format shared by the model servers: request validation, Responses <-> chat
conversion, and the reply objects (Responses, Chat Completions, and their stream events).

Both `models/hf` and `models/openai_proxy` work internally on Chat Completions messages,
so the Responses API is a conversion at the edge.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from services.core.config import describe_validation_error
from services.core.content import content_problem, content_text, item_problem
from services.core.errors import BadRequest

TRAINING_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")


class _Req(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())

    model: str | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    stop: Union[str, list[str], None] = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: Any) -> Any:
        if isinstance(value, list):
            if len(value) > 4:
                raise ValueError("at most 4 stop sequences")
            if any(not isinstance(s, str) or not s for s in value):
                raise ValueError("stop sequences must be non-empty strings")
        if isinstance(value, str) and not value:
            raise ValueError("stop sequence must be non-empty")
        return value

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatRequest(_Req):
    messages: list[dict[str, Any]] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, gt=0)
    max_completion_tokens: int | None = Field(None, gt=0)
    n: int = Field(1, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream_options: dict[str, Any] | None = None

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ResponsesRequest(_Req):
    input: Union[str, list[dict[str, Any]]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, gt=0)
    previous_response_id: str | None = None

    @field_validator("input")
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if isinstance(value, list) and not value:
            raise ValueError("input must not be empty")
        return value

    @field_validator("input", mode="before")
    @classmethod
    def _typed_items(cls, value: Any) -> Any:
        """A wrong type inside an input item or its content parts is a 400 naming the path (never a 500)."""
        if isinstance(value, list):
            problem = next((p for p in (item_problem(item, f"input[{i}]") for i, item in enumerate(value)) if p), None)
            if problem:
                raise ValueError(problem)
        return value


class CompletionRequest(_Req):
    """Legacy completions, used for token-in/token-out: `prompt` may be a list of token IDs (as vLLM allows)."""

    prompt: Union[str, list[int]]
    max_tokens: int | None = Field(None, gt=0)
    n: int = Field(1, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, value: Any) -> Any:
        if not value:
            raise ValueError("prompt must not be empty")
        return value


class _Reply(BaseModel):
    model_config = ConfigDict(extra="allow", protected_namespaces=())


class ModelCard(_Reply):
    id: str
    object: str = "model"
    owned_by: str | None = None
    weights_version: str | int | None = Field(None, description="version of the weights being served (policy servers)")


class ModelList(_Reply):
    """`GET /v1/models`."""

    object: str = "list"
    data: list[ModelCard]


class ChatCompletion(_Reply):
    """`POST /v1/chat/completions` reply (OpenAI's shape; training mode adds prompt_token_ids,
    generation_token_ids and generation_log_probs to each choice's message)."""

    id: str
    object: str = "chat.completion"
    created: int | float | None = None
    model: str | None = None
    choices: list[dict[str, Any]]
    usage: dict[str, Any] | None = None


class Completion(_Reply):
    """`POST /v1/completions` reply (OpenAI's legacy shape)."""

    id: str
    object: str = "text_completion"
    created: int | float | None = None
    model: str | None = None
    choices: list[dict[str, Any]]
    usage: dict[str, Any] | None = None


def parse_request(model: type[BaseModel], body: Any) -> Any:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise BadRequest(f"invalid request: {describe_validation_error(exc)}") from None


# --------------------------------------------------------------------------- #
# Requests -> chat messages and tools
# --------------------------------------------------------------------------- #
_ROLES = {"system", "developer", "user", "assistant", "tool"}


def check_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise BadRequest(f"messages[{i}]: must be an object")
        if not isinstance(msg.get("role"), str) or msg["role"] not in _ROLES:
            raise BadRequest(f"messages[{i}].role: must be one of {sorted(_ROLES)}, got {msg.get('role')!r}")
        content = msg.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise BadRequest(f"messages[{i}].content: must be a string or a list of content parts")
        problem = content_problem(content, f"messages[{i}].content")
        if problem:
            raise BadRequest(problem)
        for j, call in enumerate(msg.get("tool_calls") or []):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest(f"messages[{i}].tool_calls[{j}]: needs function.name")
    return messages


def chat_tools(tools: list[dict[str, Any]] | None, tool_choice: Any = None) -> list[dict[str, Any]] | None:
    """Tools in Chat Completions shape; Responses-style `{type, name, parameters}` is converted."""
    if not tools or tool_choice == "none":
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise BadRequest(f"tools[{i}]: only function tools are supported")
        if isinstance(tool.get("function"), dict):
            fn = tool["function"]
        else:
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(f"tools[{i}]: missing function name")
        out.append({"type": "function", "function": fn})
    return out


def responses_to_messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    """Responses `input` items -> chat messages; function_call items join the assistant turn before them."""
    msgs: list[dict[str, Any]] = []
    if req.instructions:
        msgs.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        msgs.append({"role": "user", "content": req.input})
        return msgs
    for i, item in enumerate(req.input):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}]: must be an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise BadRequest(f"input[{i}].role: must be system, developer, user or assistant, got {role!r}")
            content = item.get("content")
            if not isinstance(content, (str, list)):
                raise BadRequest(f"input[{i}].content: must be a string or a list of content parts")
            if isinstance(content, list):
                for j, part in enumerate(content):
                    if isinstance(part, dict) and part.get("type") in ("input_image", "input_file", "input_audio"):
                        raise BadRequest(f"input[{i}].content[{j}]: {part['type']} is not supported by this text model")
            msgs.append({"role": role, "content": content})
        elif kind == "function_call":
            if not isinstance(item.get("name"), str):
                raise BadRequest(f"input[{i}]: function_call needs a name")
            call = {"id": item.get("call_id") or item.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": item["name"], "arguments": _json_text(item.get("arguments", "{}"))}}
            if msgs and msgs[-1]["role"] == "assistant":
                msgs[-1].setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            if "call_id" not in item:
                raise BadRequest(f"input[{i}]: function_call_output needs call_id")
            msgs.append({"role": "tool", "tool_call_id": item["call_id"], "content": _json_text(item.get("output", ""))})
        elif kind == "reasoning":
            continue  # not re-rendered: templates drop past reasoning
        else:
            raise BadRequest(f"input[{i}].type: unsupported item type {kind!r}")
    return msgs


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


# --------------------------------------------------------------------------- #
# Replies
# --------------------------------------------------------------------------- #
def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def message_item(text: str) -> dict[str, Any]:
    return {"type": "message", "id": new_id("msg"), "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def function_call_item(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    return {"type": "function_call", "id": new_id("fc"), "call_id": call_id or new_id("call"), "name": name,
            "arguments": arguments, "status": "completed"}


def output_items(content: str, calls: list[dict[str, str]]) -> list[dict[str, Any]]:
    items = [message_item(content)] if content or not calls else []
    items += [function_call_item(c["name"], c["arguments"], c.get("id")) for c in calls]
    return items


def response_object(req: ResponsesRequest, model: str, output: list[dict[str, Any]], *, input_tokens: int,
                    output_tokens: int, finish_reason: str, status: str | None = None,
                    response_id: str | None = None, **extra: Any) -> dict[str, Any]:
    incomplete = finish_reason == "length"
    return {
        "id": response_id or new_id("resp"), "object": "response", "created_at": int(time.time()),
        "model": model, "status": status or ("incomplete" if incomplete else "completed"),
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": req.instructions, "metadata": {}, "output": output,
        "parallel_tool_calls": True, "temperature": req.temperature, "top_p": req.top_p,
        "tool_choice": req.tool_choice or "auto", "tools": req.tools or [],
        "max_output_tokens": req.max_output_tokens, "text": {"format": {"type": "text"}},
        "usage": {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": input_tokens + output_tokens},
        **extra,
    }


def chat_message(content: str, calls: list[dict[str, str]]) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": content if (content or not calls) else None}
    if calls:
        msg["tool_calls"] = [{"id": c.get("id") or new_id("call"), "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
    return msg


def chat_completion(model: str, choices: list[dict[str, Any]], *, prompt_tokens: int, completion_tokens: int,
                    completion_id: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": completion_id or new_id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": choices, "system_fingerprint": None,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}, **extra}


def chat_chunk(completion_id: str, model: str, created: int, choices: list[dict[str, Any]],
               usage: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    chunk = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model,
             "choices": choices, **extra}
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def sse(data: Any, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def stream_text_limit(text: str, markers: list[str]) -> int:
    """How much of `text` is safe to stream: not past a marker, and not a suffix that could begin one."""
    limit = len(text)
    for marker in markers:
        at = text.find(marker)
        if at >= 0:
            limit = min(limit, at)
    for marker in markers:
        for k in range(min(len(marker) - 1, limit), 0, -1):
            if text[limit - k:limit] == marker[:k]:
                limit = min(limit, limit - k)
                break
    return limit


class ResponsesStream:
    """Builds the Responses API stream events for one response, in order, with sequence numbers."""

    def __init__(self, base: dict[str, Any]) -> None:
        self.base = base
        self.seq = 0
        self.msg_id = new_id("msg")
        self.text = ""
        self.message_open = False

    def event(self, kind: str, **data: Any) -> str:
        payload = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return sse(payload, event=kind)

    def start(self) -> list[str]:
        shell = {**self.base, "status": "in_progress", "output": [], "usage": None}
        return [self.event("response.created", response=shell), self.event("response.in_progress", response=shell)]

    def _open_message(self) -> list[str]:
        self.message_open = True
        item = {"type": "message", "id": self.msg_id, "role": "assistant", "status": "in_progress", "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [self.event("response.output_item.added", output_index=0, item=item),
                self.event("response.content_part.added", item_id=self.msg_id, output_index=0, content_index=0,
                           part=part)]

    def delta(self, text: str) -> list[str]:
        if not text:
            return []
        events = [] if self.message_open else self._open_message()
        self.text += text
        events.append(self.event("response.output_text.delta", item_id=self.msg_id, output_index=0,
                                 content_index=0, delta=text, logprobs=[]))
        return events

    def finish(self, final: dict[str, Any]) -> list[str]:
        """Close what is open, announce the remaining items, then `response.completed` with the final object."""
        events: list[str] = []
        output = final["output"]
        index = 0
        for item in output:
            if item["type"] == "message":
                item["id"] = self.msg_id
                text = content_text(item["content"])
                if not self.message_open:
                    events += self._open_message()
                if text.startswith(self.text) and len(text) > len(self.text):
                    events += self.delta(text[len(self.text):])
                part = item["content"][0] if item["content"] else {"type": "output_text", "text": text}
                events.append(self.event("response.output_text.done", item_id=self.msg_id, output_index=index,
                                         content_index=0, text=text, logprobs=[]))
                events.append(self.event("response.content_part.done", item_id=self.msg_id, output_index=index,
                                         content_index=0, part=part))
            else:
                if item["type"] == "function_call":
                    added = {**item, "arguments": "", "status": "in_progress"}
                    for f in TRAINING_FIELDS:
                        added.pop(f, None)
                    events.append(self.event("response.output_item.added", output_index=index, item=added))
                    events.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                             output_index=index, delta=item["arguments"]))
                    events.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                             output_index=index, arguments=item["arguments"]))
                else:
                    events.append(self.event("response.output_item.added", output_index=index, item=item))
            events.append(self.event("response.output_item.done", output_index=index, item=item))
            index += 1
        kind = "response.completed" if final.get("status") == "completed" else "response.incomplete"
        events.append(self.event(kind, response=final))
        return events


Finish = Literal["stop", "length", "tool_calls"]
