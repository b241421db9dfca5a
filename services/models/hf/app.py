"""models/hf: an OpenAI-compatible server for a local Hugging Face model (CPU here, GPU when present).

`gymserve serve models/hf` with no `model` option serves the embedded SmolLM2-135M-Instruct;
`model=PATH` serves any local model folder. `/v1/responses`, `/v1/chat/completions` (both with
SSE streaming) and `/v1/models`. In training mode each call's last output item carries
`prompt_token_ids`, `generation_token_ids` and `generation_log_probs`.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Literal, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import Field

from services.core.app import create_app, read_json, session_id
from services.core.config import ServerConfig
from services.core.errors import BadRequest, PayloadTooLarge
from services.core.openapi import SESSION_HEADER, describe
from services.core.schemas import ResponseObject

from .. import openai_api as oa
from ..openai_api import ChatRequest, ResponsesRequest
from .service import Choice, HFModel, Turn, default_threads
from .templates import TOOL_CALL_OPEN
from .weights import add_weights_route


class Config(ServerConfig):
    model: str | None = Field(None, description="local Hugging Face model folder; unset = embedded SmolLM2-135M-Instruct")
    served_model_name: str | None = Field(None, description="name /v1/models lists (any name is accepted in requests)")
    device: str = Field("auto", description="auto (cuda when present), cpu, cuda, cuda:1, ...")
    dtype: str = Field("auto", description="auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16")
    max_batch_size: int = Field(16, ge=1, description="rows decoded together (n counts as n rows)")
    max_batch_tokens: int = Field(32768, ge=1, description="padded prompt tokens per batch (long prompts batch less)")
    batch_wait_ms: float = Field(20.0, ge=0, description="after idle, wait this long for a burst to share a batch")
    continuous_batching: bool = Field(True, description="rows join and leave the running batch at every decoding "
                                                        "step (false: each batch runs to its longest row's end)")
    max_model_len: int | None = Field(None, gt=0, description="context limit (default: the model's)")
    default_max_tokens: int = Field(512, gt=0, description="generation length when the request sets none")
    max_n: int = Field(16, ge=1, description="largest n a chat request may ask for")
    context_overflow: Literal["length", "error"] = Field(
        "length", description="prompt too long: empty completion with finish_reason length (+ context_length_exceeded) "
                              "or a 400 worded like vLLM's")
    training_mode: bool = Field(True, description="attach token IDs and logprobs to each call's last output item")
    reply_format: Literal["gymserve", "vllm"] = Field(
        "gymserve", description="vllm: chat replies carry token IDs only as vLLM returns them (prompt_token_ids and "
                                "token_ids with return_token_ids, logprob tokens as token_id:N with "
                                "return_tokens_as_token_ids), none on the message: for testing vLLM clients")
    session_cache_size: int = Field(4096, ge=0, description="sessions whose last turn is kept for token continuity")
    max_prompt_chars: int = Field(1_000_000, gt=0, description="longer prompts (characters in all messages) get 413 "
                                                               "before any rendering or tokenizing")
    accept_weights: bool = Field(False, description="accept POST /v1/weights from a trainer on this host "
                                                    "(safetensors file path + version) for on-policy training; "
                                                    "off by default, set by training stacks")
    torch_threads: int = Field(default_factory=default_threads, ge=1,
                               description="torch CPU threads (default: GYMSERVE_TORCH_THREADS, else half the cores)")


def build(config: Config) -> FastAPI:
    model = HFModel(config.model, device=config.device, dtype=config.dtype, max_batch_size=config.max_batch_size,
                    max_batch_tokens=config.max_batch_tokens, batch_wait_s=config.batch_wait_ms / 1000,
                    max_model_len=config.max_model_len, session_cache_size=config.session_cache_size,
                    served_name=config.served_model_name, threads=config.torch_threads,
                    continuous=config.continuous_batching)

    async def startup() -> None:
        await asyncio.to_thread(model.load)

    async def shutdown() -> None:
        await asyncio.to_thread(model.close)

    app = create_app(config, on_startup=[startup], on_shutdown=[shutdown], readiness=lambda: model.ready,
                     description=__doc__ or "")
    app.state.model = model

    @app.get("/v1/models", **describe(reply=oa.ModelList))
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model.served_name, "object": "model", "created": 0,
                                            "owned_by": "gymserve", "max_model_len": model.max_model_len,
                                            "weights_version": model.weights_version}]}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        engine = model.engine
        counters = {k: getattr(engine, k, 0) for k in ("batches", "rows", "tokens")} if engine else {}
        return {"model": model.served_name, "weights_version": model.weights_version, **counters}

    add_weights_route(app, accept=config.accept_weights, apply=model.update_weights,
                      unavailable=lambda: None if model.ready else "the model is still loading")

    @app.post("/v1/chat/completions", **describe(body=oa.ChatRequest, reply=oa.ChatCompletion, stream=True,
                                                 parameters=[SESSION_HEADER], errors=(429, 502, 503, 504)))
    async def chat(request: Request) -> Any:
        req: ChatRequest = oa.parse_request(ChatRequest, await read_json(request))
        if req.n > config.max_n:
            raise BadRequest(f"n={req.n} is larger than this server's max_n={config.max_n}")
        if req.stream and req.n > 1:
            raise BadRequest("streaming supports n=1 only")
        tools = oa.chat_tools(req.tools, req.tool_choice)
        session = session_id(request)
        messages = _sized(config, oa.check_messages(req.messages))
        turn = await model.off_loop(model.prepare, messages, tools, session=session,
                                    max_new_tokens=req.max_new_tokens(), default_max_tokens=config.default_max_tokens,
                                    training=config.training_mode)
        _check_overflow(config, model, turn, req.max_new_tokens())
        top = (req.top_logprobs or 0) if req.logprobs else 0
        kwargs = dict(temperature=req.temperature, top_p=req.top_p, stop=req.stop_list(), seed=req.seed, n=req.n,
                      top_logprobs=top)
        if req.stream:
            return _stream(_chat_stream(model, config, req, turn, tools, session, kwargs))
        generations = await model.generate(turn, **kwargs)
        choices = await model.off_loop(model.finish, turn, generations, session=session,
                                       training=config.training_mode, parse_tools=bool(tools))
        body = oa.chat_completion(model.served_name, [_chat_choice(i, c, model, req.logprobs) for i, c in
                                                      enumerate(choices)],
                                  prompt_tokens=len(turn.prompt_ids),
                                  completion_tokens=sum(len(c.generation.token_ids) for c in choices),
                                  **({"context_length_exceeded": True} if turn.overflow else {}))
        if config.reply_format == "vllm":
            _vllm_token_fields(body, req, turn.prompt_ids, choices)
        return JSONResponse(body)

    @app.post("/v1/completions", **describe(body=oa.CompletionRequest, reply=oa.Completion, stream=True,
                                            parameters=[SESSION_HEADER], errors=(429, 503)))
    async def completions(request: Request) -> Any:
        """Token-in/token-out completions (vLLM-style): what models/openai_proxy's `completions` mode uses."""
        req = oa.parse_request(oa.CompletionRequest, await read_json(request))
        if req.stream:
            raise BadRequest("streaming is not supported on /v1/completions")
        if req.n > config.max_n:
            raise BadRequest(f"n={req.n} is larger than this server's max_n={config.max_n}")
        if isinstance(req.prompt, str):
            ids = await model.off_loop(model.tokenize, _sized(config, req.prompt))
        else:
            ids = list(req.prompt)
        vocab = len(model.tokenizer)
        if any(not 0 <= t < vocab for t in ids):
            raise BadRequest(f"prompt: token IDs must be in [0, {vocab})")
        room = model.max_model_len - len(ids)
        if room <= 0:
            raise BadRequest(f"This model's maximum context length is {model.max_model_len} tokens. However, you "
                             f"requested {len(ids)} tokens in the prompt.", code="context_length_exceeded")
        turn = Turn([], None, "", ids, None, min(req.max_tokens or config.default_max_tokens, room))
        gens = await model.generate(turn, temperature=req.temperature, top_p=req.top_p, stop=req.stop_list(),
                                    seed=req.seed, n=req.n)
        choices = [{"index": i, "text": g.text, "finish_reason": g.finish_reason, "token_ids": g.token_ids,
                    "logprobs": None if req.logprobs is None else {
                        "tokens": [f"token_id:{t}" for t in g.token_ids], "token_logprobs": g.logprobs,
                        "top_logprobs": None, "text_offset": []}} for i, g in enumerate(gens)]
        completion = sum(len(g.token_ids) for g in gens)
        return {"id": oa.new_id("cmpl"), "object": "text_completion", "created": int(time.time()),
                "model": model.served_name, "choices": choices, "prompt_token_ids": ids,
                "usage": {"prompt_tokens": len(ids), "completion_tokens": completion,
                          "total_tokens": len(ids) + completion}}

    @app.post("/v1/responses", **describe(body=oa.ResponsesRequest, reply=ResponseObject, stream=True,
                                          parameters=[SESSION_HEADER], errors=(429, 502, 503, 504)))
    async def responses(request: Request) -> Any:
        req: ResponsesRequest = oa.parse_request(ResponsesRequest, await read_json(request))
        if req.previous_response_id:
            raise BadRequest("previous_response_id is not supported: send the full conversation as input")
        tools = oa.chat_tools(req.tools, req.tool_choice)
        session = session_id(request)
        messages = _sized(config, oa.responses_to_messages(req))
        turn = await model.off_loop(model.prepare, messages, tools, session=session,
                                    max_new_tokens=req.max_output_tokens, default_max_tokens=config.default_max_tokens,
                                    training=config.training_mode)
        _check_overflow(config, model, turn, req.max_output_tokens)
        kwargs = dict(temperature=req.temperature, top_p=req.top_p, stop=req.stop_list(), seed=req.seed, n=1)
        if req.stream:
            return _stream(_responses_stream(model, config, req, turn, tools, session, kwargs))
        generations = await model.generate(turn, **kwargs)
        choice = (await model.off_loop(model.finish, turn, generations, session=session,
                                       training=config.training_mode, parse_tools=bool(tools)))[0]
        return JSONResponse(_response_body(model, req, turn, choice))

    return app


def _text_chars(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(_text_chars(v) for v in value)
    return 0


T = TypeVar("T")


def _sized(config: Config, prompt: T) -> T:
    """`prompt` (messages or text), or a 413 when it holds more than max_prompt_chars characters."""
    chars = _text_chars(prompt)
    if chars > config.max_prompt_chars:
        raise PayloadTooLarge(f"prompt of {chars} characters exceeds this server's "
                              f"max_prompt_chars={config.max_prompt_chars}")
    return prompt


def _check_overflow(config: Config, model: HFModel, turn: Turn, requested: int | None) -> None:
    if turn.overflow and config.context_overflow == "error":
        raise BadRequest(f"This model's maximum context length is {model.max_model_len} tokens. However, you "
                         f"requested {len(turn.prompt_ids) + (requested or 0)} tokens "
                         f"({len(turn.prompt_ids)} in the messages, {requested or 0} in the completion).",
                         code="context_length_exceeded")


# --------------------------------------------------------------------------- #
# Reply builders
# --------------------------------------------------------------------------- #
def _response_body(model: HFModel, req: ResponsesRequest, turn: Turn, choice: Choice,
                   response_id: str | None = None) -> dict[str, Any]:
    output = oa.output_items(choice.content, choice.calls)
    output[-1].update(choice.extra)
    extra = {"context_length_exceeded": True} if turn.overflow else {}
    return oa.response_object(req, model.served_name, output, input_tokens=len(turn.prompt_ids),
                              output_tokens=len(choice.generation.token_ids),
                              finish_reason=choice.generation.finish_reason, response_id=response_id, **extra)


def _chat_choice(index: int, choice: Choice, model: HFModel, logprobs: bool) -> dict[str, Any]:
    message = oa.chat_message(choice.content, choice.calls)
    message.update(choice.extra)
    out: dict[str, Any] = {"index": index, "message": message, "finish_reason": choice.finish_reason,
                           "logprobs": _chat_logprobs(model, choice) if logprobs else None}
    return out


def _vllm_token_fields(body: dict[str, Any], req: ChatRequest, prompt_ids: list[int], choices: list[Choice]) -> None:
    """Move token IDs where vLLM's chat endpoint puts them, and only when the request asks as vLLM requires."""
    extras = req.model_extra or {}
    for out, choice in zip(body["choices"], choices):
        for field in (*oa.TRAINING_FIELDS, "token_continuity_broken"):
            out["message"].pop(field, None)
        if extras.get("return_token_ids"):
            out["token_ids"] = list(choice.generation.token_ids)
        if extras.get("return_tokens_as_token_ids") and out["logprobs"]:
            for entry, tid in zip(out["logprobs"]["content"], choice.generation.token_ids):
                entry["token"] = f"token_id:{tid}"
    if extras.get("return_token_ids"):
        body["prompt_token_ids"] = list(prompt_ids)


def _chat_logprobs(model: HFModel, choice: Choice) -> dict[str, Any]:
    gen = choice.generation
    tokens = model.tokenizer.convert_ids_to_tokens(gen.token_ids)

    def entry(tid: int, lp: float) -> dict[str, Any]:
        text = model.tokenizer.decode([tid])
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    content = []
    for tid, lp, tops, _tok in zip(gen.token_ids, gen.logprobs, gen.top_logprobs, tokens):
        item = entry(tid, lp)
        item["top_logprobs"] = [entry(t, v) for t, v in tops]
        content.append(item)
    return {"content": content, "refusal": None}


# --------------------------------------------------------------------------- #
# Streaming
# --------------------------------------------------------------------------- #
def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


class _TextFeed:
    """Engine updates -> safe text deltas (never past a stop string or a starting `<tool_call>`)."""

    def __init__(self, markers: list[str]) -> None:
        self.markers = markers
        self.queue: asyncio.Queue[tuple[str, bool]] = asyncio.Queue()
        self.sent = 0

    def update(self, index: int, text: str, done: bool) -> None:
        self.queue.put_nowait((text, done))

    async def deltas(self, task: asyncio.Task) -> AsyncIterator[str]:
        while True:
            getter = asyncio.ensure_future(self.queue.get())
            finished, _ = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in finished:
                getter.cancel()
                return  # the generation failed or ended before any update
            text, done = getter.result()
            limit = oa.stream_text_limit(text, self.markers)
            if limit > self.sent and text[:limit].strip():
                yield text[self.sent:limit]
                self.sent = limit
            if done:
                return


async def _chat_stream(model: HFModel, config: Config, req: ChatRequest, turn: Turn, tools: Any,
                       session: str | None, kwargs: dict[str, Any]) -> AsyncIterator[str]:
    cid, created, name = oa.new_id("chatcmpl"), int(time.time()), model.served_name
    feed = _TextFeed(req.stop_list() + ([TOOL_CALL_OPEN] if tools else []))
    task = asyncio.create_task(model.generate(turn, on_update=feed.update, **kwargs))
    try:
        yield oa.sse(oa.chat_chunk(cid, name, created, [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]))
        streamed = ""
        async for delta in feed.deltas(task):
            streamed += delta
            yield oa.sse(oa.chat_chunk(cid, name, created, [
                {"index": 0, "delta": {"content": delta}, "logprobs": None, "finish_reason": None}]))
        generations = await task
    except asyncio.CancelledError:
        task.cancel()
        raise
    except Exception as exc:
        yield oa.sse({"error": {"message": f"generation failed: {exc}", "type": "internal_error"}})
        return
    choice = (await model.off_loop(model.finish, turn, generations, session=session,
                                   training=config.training_mode, parse_tools=bool(tools)))[0]
    rest = choice.content[len(streamed):] if choice.content.startswith(streamed) else ""
    if rest:
        yield oa.sse(oa.chat_chunk(cid, name, created, [
            {"index": 0, "delta": {"content": rest}, "logprobs": None, "finish_reason": None}]))
    if choice.calls:
        calls = oa.chat_message("", choice.calls)["tool_calls"]
        yield oa.sse(oa.chat_chunk(cid, name, created, [
            {"index": 0, "delta": {"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]},
             "logprobs": None, "finish_reason": None}]))
    last = {"index": 0, "delta": {}, "logprobs": _chat_logprobs(model, choice) if req.logprobs else None,
            "finish_reason": choice.finish_reason, **choice.extra}
    extra = {"context_length_exceeded": True} if turn.overflow else {}
    yield oa.sse(oa.chat_chunk(cid, name, created, [last], **extra))
    if (req.stream_options or {}).get("include_usage"):
        usage = {"prompt_tokens": len(turn.prompt_ids), "completion_tokens": len(choice.generation.token_ids),
                 "total_tokens": len(turn.prompt_ids) + len(choice.generation.token_ids)}
        yield oa.sse(oa.chat_chunk(cid, name, created, [], usage=usage))
    yield oa.SSE_DONE


async def _responses_stream(model: HFModel, config: Config, req: ResponsesRequest, turn: Turn, tools: Any,
                            session: str | None, kwargs: dict[str, Any]) -> AsyncIterator[str]:
    rid = oa.new_id("resp")
    shell = oa.response_object(req, model.served_name, [], input_tokens=0, output_tokens=0, finish_reason="stop",
                               response_id=rid)
    events = oa.ResponsesStream(shell)
    feed = _TextFeed(req.stop_list() + ([TOOL_CALL_OPEN] if tools else []))
    task = asyncio.create_task(model.generate(turn, on_update=feed.update, **kwargs))
    try:
        for event in events.start():
            yield event
        async for delta in feed.deltas(task):
            for event in events.delta(delta):
                yield event
        generations = await task
    except asyncio.CancelledError:
        task.cancel()
        raise
    except Exception as exc:
        yield events.event("error", code="internal_error", message=f"generation failed: {exc}", param=None)
        return
    choice = (await model.off_loop(model.finish, turn, generations, session=session,
                                   training=config.training_mode, parse_tools=bool(tools)))[0]
    for event in events.finish(_response_body(model, req, turn, choice, response_id=rid)):
        yield event
