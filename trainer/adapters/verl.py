"""verl adapter: a custom reward function that scores with a gymserve environment's `/verify`.

    # verl config (gymserve on PYTHONPATH; a file path would break this module's package imports)
    reward:
      custom_reward_function:
        path: pkg://trainer.adapters.verl
        name: compute_score

Where to verify (first that is set): `extra_info["verify_url"]`, `$GYMSERVE_VERIFY_URL` (a resource
server base URL), or the resource server named `extra_info["resource_server"]` (else `data_source`)
resolved through the head at `$GYMSERVE_HEAD_URL`. `ground_truth` becomes `expected_answer`
(a dict ground truth supplies task fields instead); `extra_info["task_fields"]` adds fields.

Returns a float, or for a multi-reward environment `{"score": total, "<component>": value, ...}`
(verl logs the extra keys). verl cannot drop a sample, so a masked verify (infrastructure
failure) raises `VerifyFailed` by default rather than inventing a 0; set
`GYMSERVE_VERL_ON_FAILURE=zero` to score it 0.0 with `mask_sample: 1` in the extra info.
"""
from __future__ import annotations

import os
from typing import Any

from services.core.auth import trust
from services.core.client import shared_client
from services.core.directory import Directory

from ..client import run_sync

_directories: dict[str, Directory] = {}


class VerifyFailed(RuntimeError):
    """The environment could not judge the sample (masked)."""


async def _verify_url(data_source: str, extra_info: dict[str, Any]) -> str:
    url = extra_info.get("verify_url") or os.environ.get("GYMSERVE_VERIFY_URL")
    if url:
        trust(str(url))  # configured by the user: it gets the key
        return str(url).rstrip("/")
    head = os.environ.get("GYMSERVE_HEAD_URL")
    if not head:
        raise VerifyFailed("set GYMSERVE_VERIFY_URL (or extra_info.verify_url), or GYMSERVE_HEAD_URL")
    directory = _directories.setdefault(head, Directory(head, via_head="auto"))
    return await directory.url(str(extra_info.get("resource_server") or data_source))


def verify_body(solution_str: str, ground_truth: Any, extra_info: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = dict(ground_truth) if isinstance(ground_truth, dict) else {"expected_answer": ground_truth}
    fields.update(extra_info.get("task_fields") or {})
    question = extra_info.get("question") or extra_info.get("prompt") or ""
    return {"responses_create_params": {"input": [{"role": "user", "content": str(question)}]},
            "response": {"object": "response", "status": "completed", "output": [
                {"type": "message", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": solution_str, "annotations": []}]}]},
            **fields}


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
                  ) -> float | dict[str, Any]:
    """verl's reward function signature (synchronous)."""
    info = dict(extra_info or {})
    body = verify_body(solution_str, ground_truth, info)

    async def call() -> Any:
        url = await _verify_url(data_source, info)
        return await shared_client().post_json(f"{url}/verify", body, deadline_s=float(info.get("timeout_s", 300)))

    reply = run_sync(call)
    if reply.get("mask_sample"):
        if os.environ.get("GYMSERVE_VERL_ON_FAILURE", "raise") == "zero":
            return {"score": 0.0, "mask_sample": 1}
        raise VerifyFailed(f"{data_source}: verification failed ({reply.get('failure_kind')}): "
                           f"{reply.get('failure_reason')}")
    score = float(reply["reward"])
    components = reply.get("reward_components")
    if components:
        return {"score": score, **{name: float(value) for name, value in components.items()}}
    return score
