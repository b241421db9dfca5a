"""models/openai_proxy: an OpenAI-compatible front for any upstream (vLLM, SGLang, a provider, models/hf).

- `/v1/chat/completions` is forwarded; `/v1/responses` is converted to Chat Completions unless
  `upstream_api=responses` (most local servers only have chat).
- In training mode it asks vLLM for token IDs and logprobs (`return_token_ids`,
  `logprobs`, `return_tokens_as_token_ids`) and attaches `prompt_token_ids`,
  `generation_token_ids`, `generation_log_probs` to each call's last output item.
- Several `base_urls`: a session (X-Session-Id) stays on one, so its prefix cache is reused.
- Token continuity: the session's previous prompt+generated IDs must prefix the next prompt's
  IDs; the session id is forwarded so an upstream that keeps continuity (models/hf) does; any
  mismatch is flagged `token_continuity_broken: true`.
- A context-length overflow becomes an empty completion (finish reason `length`) with
  `context_length_exceeded: true`, so a rollout ends cleanly instead of failing.
- Streaming requests are served from one upstream call and replayed as SSE events, because
  the training fields only exist once the generation is complete.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field, model_validator

from services.core.app import create_app, read_json, session_id
from services.core.client import ServiceClient
from services.core.config import ServerConfig
from services.core.errors import UpstreamError
from services.core.openapi import SESSION_HEADER, describe
from services.core.schemas import ResponseObject

from .. import openai_api as oa
from ..hf.continuity import SessionTokens
from ..hf.service import HFModel
from ..hf.templates import parse_tool_calls
from ..hf.types import Generation
from ..openai_api import ChatRequest, ResponsesRequest
from .upstream import (VLLM_TOKEN_EXTRAS, UpstreamPicker, is_context_overflow, map_error, training_tokens,
                       upstream_message)


class Config(ServerConfig):
    base_url: str | None = Field(None, description="upstream OpenAI-compatible base URL (with or without /v1)")
    base_urls: list[str] = Field(default_factory=list, description="several upstreams; a session sticks to one")
    api_key: str | None = Field(None, description="upstream key: ${ENV_VAR} or api_key_file: PATH, never inline")
    model: str | None = Field(None, description="upstream model name (default: the request's)")
    upstream_api: Literal["chat", "responses", "completions"] = Field(
        "chat", description="chat; responses (passed through); completions: token-in/token-out with `tokenizer`")
    tokenizer: str | None = Field(None, description="local tokenizer folder (with chat template) for completions mode")
    default_max_tokens: int = Field(512, gt=0, description="completions mode: when the request sets none")
    training_mode: bool = Field(True, description="attach token IDs and logprobs to each call's last output item")
    vllm_token_extras: bool = Field(True, description="send vLLM's return_token_ids/logprobs extras in training mode")
    deadline_s: float = Field(600.0, gt=0, description="per-call deadline, retries included")
    retries: int = Field(2, ge=0, description="retries on connect errors and 502/503/504")
    session_cache_size: int = Field(4096, ge=0)

    @model_validator(mode="after")
    def _urls(self) -> "Config":
        if not self.base_urls and self.base_url:
            self.base_urls = [self.base_url]
        if not self.base_urls:
            raise ValueError("set base_url or base_urls (the upstream OpenAI-compatible server)")
        self.base_urls = [_v1(u) for u in self.base_urls]
        if self.upstream_api == "completions" and not self.tokenizer:
            raise ValueError("upstream_api=completions renders prompts here: set tokenizer (a local tokenizer folder)")
        return self


def _v1(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def build(config: Config) -> FastAPI:
    client = ServiceClient(deadline_s=config.deadline_s, retries=config.retries)
    picker = UpstreamPicker(config.base_urls)
    sessions = SessionTokens(config.session_cache_size)

    async def shutdown() -> None:
        await client.aclose()

    local = HFModel(None, session_cache_size=config.session_cache_size)  # tokenizer only: completions mode

    async def startup() -> None:
        if config.upstream_api == "completions":
            await asyncio.to_thread(local.load_tokenizer, str(config.tokenizer), 1 << 30)

    app = create_app(config, on_startup=[startup], on_shutdown=[shutdown], description=__doc__ or "")

    def headers() -> dict[str, str]:
        # The upstream's own key replaces gymserve's bearer token (which must not leak to a provider).
        return {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}

    async def call(path: str, body: dict[str, Any], session: str | None) -> tuple[int, Any]:
        url = picker.pick(session) + path
        response = await client.request("POST", url, json=body, headers=headers(), session_id=session)
        try:
            data = response.json()
        except ValueError:
            if response.status_code < 400:
                raise UpstreamError(f"{url} answered with invalid JSON: {response.text[:200]}") from None
            data = None
        if response.status_code >= 400:
            return response.status_code, upstream_message(data, response.text)
        return response.status_code, data

    extras = {"on": config.training_mode and config.vllm_token_extras}

    def upstream_body(body: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        if config.model:
            out["model"] = config.model
        if extras["on"]:
            for key, value in VLLM_TOKEN_EXTRAS.items():
                out.setdefault(key, value)
        return out

    async def call_chat(body: dict[str, Any], session: str | None) -> tuple[int, Any]:
        status, data = await call("/chat/completions", upstream_body(body), session)
        if status == 400 and extras["on"] and any(k in str(data) for k in VLLM_TOKEN_EXTRAS if k != "logprobs"):
            # Not vLLM (a provider rejecting vLLM's extras): stop sending them, and retry once.
            extras["on"] = False
            status, data = await call("/chat/completions", upstream_body(body), session)
        return status, data

    def check_continuity(session: str | None, fields: dict[str, Any] | None) -> None:
        """Flag the turn if the session's previous prompt+generation does not prefix this prompt."""
        if not fields or not session:
            return
        prompt = fields.get("prompt_token_ids") or []
        previous = sessions.get(session)
        if previous and not any(s.prefixes(prompt) for s in previous):
            fields["token_continuity_broken"] = True

    def remember(session: str | None, all_fields: list[dict[str, Any]]) -> None:
        from ..hf.continuity import TurnState

        states = [TurnState.of("", list(f.get("prompt_token_ids") or []) + list(f.get("generation_token_ids") or []),
                               None, True) for f in all_fields if f]
        if session and states:
            sessions.put(session, states)

    async def completions_call(req: ChatRequest, session: str | None) -> dict[str, Any]:
        """Render and tokenize here (splicing the session's previous IDs), generate upstream from token IDs."""
        tools = oa.chat_tools(req.tools, req.tool_choice)
        turn = local.prepare(oa.check_messages(req.messages), tools, session=session,
                             max_new_tokens=req.max_new_tokens(), default_max_tokens=config.default_max_tokens,
                             training=config.training_mode)
        body: dict[str, Any] = {"model": config.model or req.model or "default", "prompt": turn.prompt_ids,
                                "max_tokens": turn.max_new_tokens, "n": req.n, "logprobs": 1,
                                "return_tokens_as_token_ids": True, "return_token_ids": True}
        for key in ("temperature", "top_p", "seed"):
            if getattr(req, key) is not None:
                body[key] = getattr(req, key)
        if req.stop_list():
            body["stop"] = req.stop_list()
        status, data = await call("/completions", body, session)
        if status >= 400:
            if is_context_overflow(status, data):
                return _overflow_completion(req, config.model or req.model or "", req.n, data)
            raise map_error(status, data)
        generations = []
        for choice in (data or {}).get("choices") or []:
            fields = training_tokens({"prompt_token_ids": turn.prompt_ids}, _as_chat_choice(choice))
            if fields is None:
                raise UpstreamError("upstream completion carries no token IDs (is it vLLM with return_token_ids?)")
            generations.append(Generation(fields["generation_token_ids"], fields["generation_log_probs"], [],
                                          choice.get("text") or "",
                                          "length" if choice.get("finish_reason") == "length" else "stop"))
        choices = local.finish(turn, generations, session=session, training=config.training_mode,
                               parse_tools=bool(tools))
        out = []
        for i, c in enumerate(choices):
            message = oa.chat_message(c.content, c.calls)
            message.update(c.extra)
            out.append({"index": i, "message": message, "finish_reason": c.finish_reason, "logprobs": None})
        return oa.chat_completion(data.get("model") or config.model or "", out, prompt_tokens=len(turn.prompt_ids),
                                  completion_tokens=sum(len(c.generation.token_ids) for c in choices))

    async def chat_call(body: dict[str, Any], req: ChatRequest, session: str | None) -> dict[str, Any]:
        if config.upstream_api == "completions":
            return await completions_call(req, session)
        status, data = await call_chat(body, session)
        if status >= 400:
            if is_context_overflow(status, data):
                return _overflow_completion(req, config.model or req.model or "", req.n, data)
            raise map_error(status, data)
        if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
            raise UpstreamError("upstream chat completion has no choices")
        all_fields = []
        for choice in data["choices"]:
            message = choice.setdefault("message", {})
            if req.tools and not message.get("tool_calls") and "<tool_call>" in (message.get("content") or ""):
                content, calls = parse_tool_calls(message["content"])  # upstream without a tool parser
                if calls:
                    message.update(oa.chat_message(content, calls))
                    if choice.get("finish_reason") == "stop":
                        choice["finish_reason"] = "tool_calls"
            if not config.training_mode:
                for key in oa.TRAINING_FIELDS + ("token_continuity_broken",):
                    message.pop(key, None)
            fields = training_tokens(data, choice) if config.training_mode else None
            if fields:
                check_continuity(session, fields)
                message.update(fields)
                all_fields.append(fields)
            choice.pop("token_ids", None)
            if not req.logprobs:
                choice["logprobs"] = None
        data.pop("prompt_token_ids", None)
        if config.training_mode:
            remember(session, all_fields)
        return data

    @app.get("/v1/models", **describe(reply=oa.ModelList, errors=(502, 503, 504)))
    async def models() -> Any:
        if config.model:
            return {"object": "list", "data": [{"id": config.model, "object": "model", "created": 0,
                                                "owned_by": "upstream"}]}
        response = await client.request("GET", picker.pick(None) + "/models", headers=headers())
        if response.status_code >= 400:
            raise map_error(response.status_code, upstream_message(_json(response), response.text))
        return JSONResponse(response.json())

    @app.post("/v1/chat/completions", **describe(body=oa.ChatRequest, reply=oa.ChatCompletion, stream=True,
                                                 parameters=[SESSION_HEADER], errors=(429, 502, 503, 504), passes_4xx=True))
    async def chat(request: Request) -> Any:
        body = await read_json(request)
        req: ChatRequest = oa.parse_request(ChatRequest, body)
        oa.check_messages(req.messages)
        data = await chat_call(body, req, session_id(request))
        if req.stream:
            return _sse(_chat_events(data, req))
        return JSONResponse(data)

    @app.post("/v1/responses", **describe(body=oa.ResponsesRequest, reply=ResponseObject, stream=True,
                                          parameters=[SESSION_HEADER], errors=(429, 502, 503, 504), passes_4xx=True))
    async def responses(request: Request) -> Any:
        body = await read_json(request)
        req: ResponsesRequest = oa.parse_request(ResponsesRequest, body)
        session = session_id(request)
        if config.upstream_api == "responses":  # completions mode goes through chat_call as well
            final = await responses_passthrough(body, session)
        else:
            final = await responses_via_chat(req, session)
        if req.stream:
            return _sse(_responses_events(final))
        return JSONResponse(final)

    async def responses_passthrough(body: dict[str, Any], session: str | None) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if k != "stream"}
        if config.model:
            out["model"] = config.model
        status, data = await call("/responses", out, session)
        if status >= 400:
            if is_context_overflow(status, data):
                req = oa.parse_request(ResponsesRequest, body)
                return oa.response_object(req, config.model or req.model or "", [oa.message_item("")],
                                          input_tokens=0, output_tokens=0, finish_reason="length",
                                          context_length_exceeded=True, upstream_error=data)
            raise map_error(status, data)
        if not isinstance(data, dict) or not isinstance(data.get("output"), list):
            raise UpstreamError("upstream response has no output list")
        if config.training_mode and data["output"]:
            last = data["output"][-1]
            if isinstance(last.get("generation_token_ids"), list):
                check_continuity(session, last)
                remember(session, [last])
        return data

    async def responses_via_chat(req: ResponsesRequest, session: str | None) -> dict[str, Any]:
        messages = oa.responses_to_messages(req)
        chat_body: dict[str, Any] = {"model": req.model or config.model or "default", "messages": messages}
        tools = oa.chat_tools(req.tools, req.tool_choice)
        if tools:
            chat_body["tools"] = tools
            if isinstance(req.tool_choice, (str, dict)) and req.tool_choice != "none":
                chat_body["tool_choice"] = _chat_tool_choice(req.tool_choice)
        for src, dst in (("temperature", "temperature"), ("top_p", "top_p"), ("max_output_tokens", "max_tokens"),
                         ("seed", "seed"), ("stop", "stop")):
            value = getattr(req, src)
            if value is not None:
                chat_body[dst] = value
        chat_req = oa.parse_request(ChatRequest, chat_body)
        data = await chat_call(chat_body, chat_req, session)
        choice = data["choices"][0] if data.get("choices") else {"message": {"content": ""}, "finish_reason": "stop"}
        message = choice.get("message") or {}
        calls = [{"name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}",
                  "id": c.get("id")} for c in message.get("tool_calls") or []]
        output = oa.output_items(message.get("content") or "", calls)
        for key in oa.TRAINING_FIELDS + ("token_continuity_broken",):
            if key in message:
                output[-1][key] = message[key]
        usage = data.get("usage") or {}
        extra = {"context_length_exceeded": True} if data.get("context_length_exceeded") else {}
        return oa.response_object(req, data.get("model") or req.model or "", output,
                                  input_tokens=int(usage.get("prompt_tokens") or 0),
                                  output_tokens=int(usage.get("completion_tokens") or 0),
                                  finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
                                  **extra)

    return app


def _as_chat_choice(choice: dict[str, Any]) -> dict[str, Any]:
    """A completions choice in the chat shape `training_tokens` reads (token_ids, logprobs.content)."""
    logprobs = choice.get("logprobs") or {}
    content = [{"token": t, "logprob": lp} for t, lp in zip(logprobs.get("tokens") or [],
                                                           logprobs.get("token_logprobs") or [])]
    return {"message": {}, "token_ids": choice.get("token_ids"), "logprobs": {"content": content}}


def _json(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _overflow_completion(req: ChatRequest, model: str, n: int, message: str) -> dict[str, Any]:
    choices = [{"index": i, "message": {"role": "assistant", "content": ""}, "finish_reason": "length",
                "logprobs": None} for i in range(n)]
    return oa.chat_completion(model, choices, prompt_tokens=0, completion_tokens=0, context_length_exceeded=True,
                              upstream_error=message)


def _sse(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _chat_events(data: dict[str, Any], req: ChatRequest) -> AsyncIterator[str]:
    cid, model, created = data.get("id") or oa.new_id("chatcmpl"), data.get("model") or "", int(time.time())
    extra = {"context_length_exceeded": True} if data.get("context_length_exceeded") else {}
    for choice in data.get("choices") or []:
        message = dict(choice.get("message") or {})
        index = choice.get("index", 0)
        yield oa.sse(oa.chat_chunk(cid, model, created, [
            {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]))
        if message.get("content"):
            yield oa.sse(oa.chat_chunk(cid, model, created, [
                {"index": index, "delta": {"content": message["content"]}, "logprobs": None, "finish_reason": None}]))
        if message.get("tool_calls"):
            calls = [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]
            yield oa.sse(oa.chat_chunk(cid, model, created, [
                {"index": index, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}]))
        fields = {k: message[k] for k in oa.TRAINING_FIELDS + ("token_continuity_broken",) if k in message}
        yield oa.sse(oa.chat_chunk(cid, model, created, [
            {"index": index, "delta": {}, "logprobs": choice.get("logprobs"),
             "finish_reason": choice.get("finish_reason") or "stop", **fields}], **extra))
    if (req.stream_options or {}).get("include_usage"):
        yield oa.sse(oa.chat_chunk(cid, model, created, [], usage=data.get("usage")))
    yield oa.SSE_DONE


async def _responses_events(final: dict[str, Any]) -> AsyncIterator[str]:
    stream = oa.ResponsesStream({**final})
    for event in stream.start():
        yield event
    for event in stream.finish(json.loads(json.dumps(final))):
        yield event
