"""Talking to the upstream: base-URL choice per session, the vLLM extras that return token IDs
and logprobs, reading those back from the shapes servers use, and mapping upstream errors.
"""
from __future__ import annotations

import hashlib
import itertools
import re
from typing import Any

from services.core.errors import GymError, UpstreamError
from services.core.failures import FailureKind

VLLM_TOKEN_EXTRAS = {"logprobs": True, "return_tokens_as_token_ids": True, "return_token_ids": True}
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")
_OVERFLOW = re.compile(r"maximum context length|context length|context_length_exceeded|too many tokens|"
                       r"prompt is too long|exceeds the model|longer than the model", re.IGNORECASE)


class UpstreamPicker:
    """Round-robin over base URLs, with each session pinned to one (its KV cache lives there)."""

    def __init__(self, base_urls: list[str]) -> None:
        self.base_urls = [u.rstrip("/") for u in base_urls]
        self._next = itertools.cycle(range(len(self.base_urls)))

    def pick(self, session: str | None) -> str:
        if len(self.base_urls) == 1:
            return self.base_urls[0]
        if session:
            digest = hashlib.blake2b(session.encode(), digest_size=8).digest()
            return self.base_urls[int.from_bytes(digest, "big") % len(self.base_urls)]
        return self.base_urls[next(self._next)]


def is_context_overflow(status: int, message: str) -> bool:
    return status == 400 and bool(_OVERFLOW.search(message or ""))


def upstream_message(body: Any, text: str) -> str:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if body.get("detail"):
            return str(body["detail"])
        if body.get("message"):
            return str(body["message"])
    return text[:500]


def map_error(status: int, message: str) -> GymError:
    """Upstream 4xx stay 4xx (the request was wrong); 5xx and others become 502 (the upstream failed)."""
    if 400 <= status < 500 and status not in (401, 403, 408, 429):
        return GymError(f"upstream rejected the request ({status}): {message}", status_code=status)
    if status == 429:
        return GymError(f"upstream is rate limiting ({status}): {message}", status_code=429)
    if status in (401, 403):
        return UpstreamError(f"upstream refused our credentials ({status}): {message}", upstream_status=status)
    if status == 408:
        return UpstreamError(f"upstream timed out ({status}): {message}", kind=FailureKind.TIMEOUT, upstream_status=status)
    return UpstreamError(f"upstream failed ({status}): {message}", upstream_status=status)


def training_tokens(reply: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any] | None:
    """prompt/generation token IDs and logprobs from a chat completion, whichever shape carries them:
    gymserve/NeMo-Gym fields on the message, or vLLM's `prompt_token_ids` + `token_ids` + logprobs."""
    message = choice.get("message") or {}
    if isinstance(message.get("generation_token_ids"), list):
        return {"prompt_token_ids": list(message.get("prompt_token_ids") or []),
                "generation_token_ids": list(message["generation_token_ids"]),
                "generation_log_probs": list(message.get("generation_log_probs") or []),
                **({"token_continuity_broken": True} if message.get("token_continuity_broken") else {})}
    prompt = reply.get("prompt_token_ids") or choice.get("prompt_token_ids")
    logprobs = ((choice.get("logprobs") or {}).get("content")) or []
    gen = choice.get("token_ids")
    if gen is None and logprobs:
        ids = [_TOKEN_ID.match(str(e.get("token", ""))) for e in logprobs]
        gen = [int(m.group(1)) for m in ids] if all(ids) else None
    if prompt is None or gen is None:
        return None
    lps = [float(e.get("logprob", 0.0)) for e in logprobs] if logprobs else []
    return {"prompt_token_ids": list(prompt), "generation_token_ids": list(gen), "generation_log_probs": lps}
