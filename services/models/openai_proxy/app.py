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

from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import Field, model_validator

from services.core.app import create_app, read_json, session_id
from services.core.config import ServerConfig
from services.core.openapi import SESSION_HEADER, describe
from services.core.schemas import ResponseObject

from .. import openai_api as oa
from ..openai_api import ChatRequest, ResponsesRequest
from .proxy import OpenAIProxy
from .streaming import chat_events, responses_events, sse_response


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
    proxy = OpenAIProxy(config)
    app = create_app(config, on_startup=[proxy.start], on_shutdown=[proxy.close], description=__doc__ or "")

    @app.get("/v1/models", **describe(reply=oa.ModelList, errors=(502, 503, 504)))
    async def models() -> Any:
        return JSONResponse(await proxy.models())

    add_routes(app, proxy, config)
    return app


def add_routes(app: FastAPI, proxy: OpenAIProxy, config: Config) -> None:
    """The generation routes, shared with models/vllm (which puts this proxy in front of its vLLM)."""

    @app.post("/v1/chat/completions", **describe(body=oa.ChatRequest, reply=oa.ChatCompletion, stream=True,
                                                 parameters=[SESSION_HEADER], errors=(429, 502, 503, 504),
                                                 passes_4xx=True))
    async def chat(request: Request) -> Any:
        body = await read_json(request)
        req: ChatRequest = oa.parse_request(ChatRequest, body)
        oa.check_messages(req.messages)
        data = await proxy.chat_call(body, req, session_id(request))
        if req.stream:
            return sse_response(chat_events(data, req))
        return JSONResponse(data)

    @app.post("/v1/responses", **describe(body=oa.ResponsesRequest, reply=ResponseObject, stream=True,
                                          parameters=[SESSION_HEADER], errors=(429, 502, 503, 504), passes_4xx=True))
    async def responses(request: Request) -> Any:
        body = await read_json(request)
        req: ResponsesRequest = oa.parse_request(ResponsesRequest, body)
        session = session_id(request)
        if config.upstream_api == "responses":  # completions mode goes through chat_call as well
            final = await proxy.responses_passthrough(body, session)
        else:
            final = await proxy.responses_via_chat(req, session)
        if req.stream:
            return sse_response(responses_events(final))
        return JSONResponse(final)
