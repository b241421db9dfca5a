"""The proxy's work behind the routes: upstream choice, API conversion, training tokens and continuity."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable

from services.core.client import ServiceClient
from services.core.errors import UpstreamError

from .. import openai_api as oa
from ..hf.continuity import SessionTokens, TurnState
from ..hf.service import HFModel
from ..hf.templates import parse_tool_calls
from ..hf.types import Generation
from ..openai_api import ChatRequest, ResponsesRequest
from .upstream import (VLLM_TOKEN_EXTRAS, UpstreamPicker, is_context_overflow, map_error, training_tokens,
                       upstream_message)

if TYPE_CHECKING:
    from .app import Config


class OpenAIProxy:
    """One per server. Holds the upstream client, the sticky-session picker, the per-session token
    history (for continuity checks) and, in completions mode, a local tokenizer."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.client = ServiceClient(deadline_s=config.deadline_s, retries=config.retries)
        self.picker = UpstreamPicker(config.base_urls)
        self.sessions = SessionTokens(config.session_cache_size)
        self.local = HFModel(None, session_cache_size=config.session_cache_size)  # tokenizer only: completions mode
        # vLLM's token extras; switched off for good once an upstream rejects them (a provider, not vLLM).
        self.send_token_extras = config.training_mode and config.vllm_token_extras
        self._upstream_models: list[str] | None = None  # the upstream's model ids, asked once
        # The upstream's weights version, when the server embedding this proxy knows it (models/vllm): read
        # when a call starts, so a call that overlaps a weight push is labelled with the older version.
        self.weights_version: Callable[[], int] | None = None

    async def model_name(self, requested: str | None) -> str:
        """The upstream model to ask for: `model`, else the upstream's only model (a vLLM server serves
        one, and a request's own name, e.g. none or the agent's, would be a 404 there), else the request's."""
        if self.config.model:
            return self.config.model
        if self._upstream_models is None:
            try:
                listed = await self.models()
                self._upstream_models = [str(d["id"]) for d in listed.get("data") or [] if d.get("id")]
            except Exception:  # a provider without /models: the request's name it is
                self._upstream_models = []
        if len(self._upstream_models) == 1:
            return self._upstream_models[0]
        return requested or (self._upstream_models[0] if self._upstream_models else "default")

    async def start(self) -> None:
        if self.config.upstream_api == "completions":
            await asyncio.to_thread(self.local.load_tokenizer, str(self.config.tokenizer), 1 << 30)

    async def close(self) -> None:
        await self.client.aclose()

    def headers(self) -> dict[str, str]:
        # The upstream's own key replaces gymserve's bearer token (which must not leak to a provider).
        return {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}

    async def call(self, path: str, body: dict[str, Any], session: str | None) -> tuple[int, Any]:
        url = self.picker.pick(session) + path
        response = await self.client.request("POST", url, json=body, headers=self.headers(), session_id=session)
        try:
            data = response.json()
        except ValueError:
            if response.status_code < 400:
                raise UpstreamError(f"{url} answered with invalid JSON: {response.text[:200]}") from None
            data = None
        if response.status_code >= 400:
            return response.status_code, upstream_message(data, response.text)
        return response.status_code, data

    def upstream_body(self, body: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        if self.config.model:
            out["model"] = self.config.model
        if self.send_token_extras:
            for key, value in VLLM_TOKEN_EXTRAS.items():
                out.setdefault(key, value)
        return out

    async def call_chat(self, body: dict[str, Any], session: str | None) -> tuple[int, Any]:
        body = {**body, "model": await self.model_name(body.get("model"))}
        status, data = await self.call("/chat/completions", self.upstream_body(body), session)
        if status == 400 and self.send_token_extras and any(k in str(data) for k in VLLM_TOKEN_EXTRAS if k != "logprobs"):
            # Not vLLM (a provider rejecting vLLM's extras): stop sending them, and retry once.
            self.send_token_extras = False
            status, data = await self.call("/chat/completions", self.upstream_body(body), session)
        return status, data

    def check_continuity(self, session: str | None, fields: dict[str, Any] | None) -> None:
        """Flag the turn if the session's previous prompt+generation does not prefix this prompt."""
        if not fields or not session:
            return
        prompt = fields.get("prompt_token_ids") or []
        previous = self.sessions.get(session)
        if previous and not any(s.prefixes(prompt) for s in previous):
            fields["token_continuity_broken"] = True

    def remember(self, session: str | None, all_fields: list[dict[str, Any]]) -> None:
        states = [TurnState.of("", list(f.get("prompt_token_ids") or []) + list(f.get("generation_token_ids") or []),
                               None, True) for f in all_fields if f]
        if session and states:
            self.sessions.put(session, states)

    async def models(self) -> Any:
        if self.config.model:
            return {"object": "list", "data": [{"id": self.config.model, "object": "model", "created": 0,
                                                "owned_by": "upstream"}]}
        response = await self.client.request("GET", self.picker.pick(None) + "/models", headers=self.headers())
        if response.status_code >= 400:
            raise map_error(response.status_code, upstream_message(_json(response), response.text))
        return response.json()

    async def completions_call(self, req: ChatRequest, session: str | None) -> dict[str, Any]:
        """Render and tokenize here (splicing the session's previous IDs), generate upstream from token IDs."""
        tools = oa.chat_tools(req.tools, req.tool_choice)
        turn = self.local.prepare(oa.check_messages(req.messages), tools, session=session,
                                  max_new_tokens=req.max_new_tokens(),
                                  default_max_tokens=self.config.default_max_tokens,
                                  training=self.config.training_mode)
        body: dict[str, Any] = {"model": await self.model_name(req.model), "prompt": turn.prompt_ids,
                                "max_tokens": turn.max_new_tokens, "n": req.n, "logprobs": 1,
                                "return_tokens_as_token_ids": True, "return_token_ids": True}
        for key in ("temperature", "top_p", "seed"):
            if getattr(req, key) is not None:
                body[key] = getattr(req, key)
        if req.stop_list():
            body["stop"] = req.stop_list()
        version = self.weights_version() if self.weights_version is not None else None
        status, data = await self.call("/completions", body, session)
        if status >= 400:
            if is_context_overflow(status, data):
                return _overflow_completion(req, self.config.model or req.model or "", req.n, data)
            raise map_error(status, data)
        generations = []
        for choice in (data or {}).get("choices") or []:
            fields = training_tokens({"prompt_token_ids": turn.prompt_ids}, _as_chat_choice(choice))
            if fields is None:
                raise UpstreamError("upstream completion carries no token IDs (is it vLLM with return_token_ids?)")
            generations.append(Generation(fields["generation_token_ids"], fields["generation_log_probs"], [],
                                          choice.get("text") or "",
                                          "length" if choice.get("finish_reason") == "length" else "stop",
                                          policy_version=version))
        choices = self.local.finish(turn, generations, session=session, training=self.config.training_mode,
                                    parse_tools=bool(tools))
        out = []
        for i, c in enumerate(choices):
            message = oa.chat_message(c.content, c.calls)
            message.update(c.extra)
            out.append({"index": i, "message": message, "finish_reason": c.finish_reason, "logprobs": None})
        return oa.chat_completion(data.get("model") or self.config.model or "", out,
                                  prompt_tokens=len(turn.prompt_ids),
                                  completion_tokens=sum(len(c.generation.token_ids) for c in choices))

    async def chat_call(self, body: dict[str, Any], req: ChatRequest, session: str | None) -> dict[str, Any]:
        if self.config.upstream_api == "completions":
            return await self.completions_call(req, session)
        status, data = await self.call_chat(body, session)
        if status >= 400:
            if is_context_overflow(status, data):
                return _overflow_completion(req, self.config.model or req.model or "", req.n, data)
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
            if not self.config.training_mode:
                for key in oa.TRAINING_FIELDS + ("token_continuity_broken",):
                    message.pop(key, None)
            fields = training_tokens(data, choice) if self.config.training_mode else None
            if fields:
                self.check_continuity(session, fields)
                message.update(fields)
                all_fields.append(fields)
            choice.pop("token_ids", None)
            if not req.logprobs:
                choice["logprobs"] = None
        data.pop("prompt_token_ids", None)
        if self.config.training_mode:
            self.remember(session, all_fields)
        return data

    async def responses_passthrough(self, body: dict[str, Any], session: str | None) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if k != "stream"}
        out["model"] = await self.model_name(body.get("model"))
        status, data = await self.call("/responses", out, session)
        if status >= 400:
            if is_context_overflow(status, data):
                req = oa.parse_request(ResponsesRequest, body)
                return oa.response_object(req, self.config.model or req.model or "", [oa.message_item("")],
                                          input_tokens=0, output_tokens=0, finish_reason="length",
                                          context_length_exceeded=True, upstream_error=data)
            raise map_error(status, data)
        if not isinstance(data, dict) or not isinstance(data.get("output"), list):
            raise UpstreamError("upstream response has no output list")
        if self.config.training_mode:
            last = data["output"][-1] if data["output"] else {}
            if not isinstance(last.get("generation_token_ids"), list):
                # vLLM's Responses API returns no token IDs in our fields: a rollout without them cannot train
                raise UpstreamError("training_mode: the upstream's Responses reply carries no generation_token_ids; "
                                    "use upstream_api=completions (token IDs and logprobs from vLLM) or set "
                                    "training_mode=false for evaluation only")
            self.check_continuity(session, last)
            self.remember(session, [last])
        return data

    async def responses_via_chat(self, req: ResponsesRequest, session: str | None) -> dict[str, Any]:
        messages = oa.responses_to_messages(req)
        chat_body: dict[str, Any] = {"model": req.model or self.config.model or "default", "messages": messages}
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
        data = await self.chat_call(chat_body, chat_req, session)
        choice = data["choices"][0] if data.get("choices") else {"message": {"content": ""}, "finish_reason": "stop"}
        message = choice.get("message") or {}
        calls = [{"name": c["function"]["name"], "arguments": c["function"].get("arguments") or "{}",
                  "id": c.get("id")} for c in message.get("tool_calls") or []]
        output = oa.output_items(message.get("content") or "", calls)
        for key in oa.TRAINING_FIELDS + ("token_continuity_broken", "policy_version"):
            if key in message:
                output[-1][key] = message[key]
        usage = data.get("usage") or {}
        extra = {"context_length_exceeded": True} if data.get("context_length_exceeded") else {}
        return oa.response_object(req, data.get("model") or req.model or "", output,
                                  input_tokens=int(usage.get("prompt_tokens") or 0),
                                  output_tokens=int(usage.get("completion_tokens") or 0),
                                  finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
                                  **extra)


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
