"""Streaming replies, replayed as SSE from one finished upstream call (the training fields only exist
once the generation is complete)."""
from __future__ import annotations

import json
import time
from typing import Any, AsyncIterator

from fastapi.responses import StreamingResponse

from .. import openai_api as oa
from ..openai_api import ChatRequest


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def chat_events(data: dict[str, Any], req: ChatRequest) -> AsyncIterator[str]:
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


async def responses_events(final: dict[str, Any]) -> AsyncIterator[str]:
    stream = oa.ResponsesStream({**final})
    for event in stream.start():
        yield event
    for event in stream.finish(json.loads(json.dumps(final))):
        yield event
