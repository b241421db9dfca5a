"""OpenRLHF remote reward model endpoint: `POST /get_reward` on the head.

OpenRLHF (`--remote_rm_url http://HEAD/get_reward`) posts `{"query": [...], "prompts": [...],
"labels": [...]}`: each query is prompt + response text. We cut the response off the
prompt, build one `/verify` body per item (label -> `expected_answer`; a label that is a JSON
object supplies task fields instead) and send them in one `/verify/batch` to the configured
environment (stack `head.openrlhf_environment`, or `environment` in the body).

Reply: `{"rewards", "scores", "extra_logs", "failure_kind"}`. OpenRLHF has no way to drop a
sample, so a masked verify (infrastructure failure) gets reward 0.0 *and* is reported in
`extra_logs.mask_sample` / `extra_logs.num_masked` (numbers: OpenRLHF logs each extra_logs key as
a per-sample metric), with its kind in `failure_kind`, never silently.
"""
from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request

from services.core.app import read_json
from services.core.client import shared_client
from services.core.errors import BadRequest, UpstreamError
from services.core.openapi import describe

from .schemas import OpenRLHFReply, OpenRLHFRequest


def _text_list(body: dict[str, Any], key: str, required: bool) -> list[str] | None:
    value = body.get(key)
    if value is None:
        if required:
            raise BadRequest(f"{key}: required (a list of strings)")
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"{key}: expected a list of strings")
    return value


def _label_fields(label: str | None) -> dict[str, Any]:
    if label is None:
        return {}
    stripped = label.strip()
    if stripped.startswith("{"):
        try:
            value = json.loads(stripped)
        except ValueError:
            value = None
        if isinstance(value, dict):
            return value
    return {"expected_answer": label}


def verify_bodies(query: list[str], prompts: list[str] | None, labels: list[str] | None) -> list[dict[str, Any]]:
    """One `/verify` body per query."""
    n = len(query)
    for name, values in (("prompts", prompts), ("labels", labels)):
        if values is not None and len(values) != n:
            raise BadRequest(f"{name}: {len(values)} items but query has {n}")
    bodies = []
    for i, text in enumerate(query):
        prompt = prompts[i] if prompts is not None else ""
        response = text[len(prompt):] if prompt and text.startswith(prompt) else text
        bodies.append({
            "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
            "response": {"object": "response", "status": "completed", "output": [
                {"type": "message", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": response, "annotations": []}]}]},
            **_label_fields(labels[i] if labels is not None else None),
        })
    return bodies


def add_routes(app: FastAPI, resolve_url: Callable[[str], Awaitable[str]], environment: str | None) -> None:
    @app.post("/get_reward", tags=["openrlhf"], **describe(body=OpenRLHFRequest, reply=OpenRLHFReply,
                                                            errors=(404, 502, 503, 504)))
    async def get_reward(request: Request) -> dict[str, Any]:
        body = await read_json(request)
        if not isinstance(body, dict):
            raise BadRequest("body: expected a JSON object {query, prompts, labels}")
        query = _text_list(body, "query", required=True) or []
        bodies = verify_bodies(query, _text_list(body, "prompts", False), _text_list(body, "labels", False))
        env = body.get("environment") or environment
        if not env or not isinstance(env, str):
            raise BadRequest("no environment: set head.openrlhf_environment in the stack or `environment` in the body")
        if not bodies:
            return {"rewards": [], "scores": [], "extra_logs": {"num_masked": 0, "mask_sample": []}}
        url = await resolve_url(env)
        replies = await shared_client().post_json(f"{url}/verify/batch", bodies, deadline_s=600.0)
        if not isinstance(replies, list) or len(replies) != len(bodies):
            raise UpstreamError(f"{env}: /verify/batch returned {type(replies).__name__} of unexpected length")
        rewards, masked, kinds = [], [], []
        components: dict[str, list[float]] = {}  # 0.0 where an item has no such component (masked)
        for i, reply in enumerate(replies):
            is_masked = bool(reply.get("mask_sample"))
            masked.append(is_masked)
            kinds.append(reply.get("failure_kind"))
            rewards.append(0.0 if is_masked else float(reply.get("reward", 0.0)))
            for name, value in (reply.get("reward_components") or {}).items():
                components.setdefault(name, [0.0] * len(replies))[i] = float(value)
        # OpenRLHF turns every extra_logs value into a tensor (samples_generator): numbers and bools only
        extra_logs: dict[str, Any] = {"mask_sample": masked, "num_masked": sum(masked)}
        extra_logs.update({f"reward_{name}": values for name, values in components.items()})
        return {"rewards": rewards, "scores": list(rewards), "extra_logs": extra_logs, "failure_kind": kinds}
