"""OpenRLHF reward function that calls the head's `/get_reward` with the API key.

OpenRLHF's own HTTP reward client (`--remote_rm_url http://HEAD/get_reward`) sends no
`Authorization` header, so a head that enforces its key (every `gymserve up` stack) answers 401.
OpenRLHF also loads `reward_func(queries, prompts, labels)` from a Python file, so point it here:

    --remote_rm_url /path/to/gymserve/trainer/adapters/openrlhf_reward.py   # gymserve on PYTHONPATH

The head is `$GYMSERVE_HEAD_URL` (default http://127.0.0.1:11000); the key is found as every client
finds it (`GYMSERVE_API_KEY`, `GYMSERVE_API_KEY_FILE`, else the key file `gymserve up` wrote).
Returns the head's reply: `rewards`, `scores` and `extra_logs` (OpenRLHF keeps each key per sample).
When the head cannot answer (unreachable, 5xx, timeout) every sample is masked the way the head
masks a failed verify: reward 0.0 with `extra_logs.mask_sample` set and counted in `num_masked`.
A 4xx (a wrong key, no environment configured) is a setup error and raises.
"""
from __future__ import annotations

import logging
from typing import Any

from services.core.auth import adopt_default_key, trust
from services.core.client import shared_client
from services.core.errors import UpstreamError
from services.core.failures import FailureKind
from trainer.client import default_head_url, run_sync

logger = logging.getLogger("gymserve.openrlhf_reward")
DEADLINE_S = 600.0  # the head's own budget for one /verify/batch


def masked(n: int, kind: str) -> dict[str, Any]:
    """The head's reply shape for `n` samples it could not score."""
    return {"rewards": [0.0] * n, "scores": [0.0] * n, "failure_kind": [kind] * n,
            "extra_logs": {"mask_sample": [True] * n, "num_masked": n}}


def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> dict[str, Any]:
    """OpenRLHF's reward function signature (synchronous; it runs it in a thread)."""
    adopt_default_key()
    head = default_head_url().rstrip("/")
    trust(head)  # the head the user configured gets the key
    body = {"query": list(queries), "prompts": list(prompts), "labels": list(labels)}
    try:
        reply: dict[str, Any] = run_sync(lambda: shared_client().post_json(f"{head}/get_reward", body,
                                                                            deadline_s=DEADLINE_S))
    except UpstreamError as exc:
        if exc.kind == FailureKind.BAD_REQUEST:
            logger.error("%s/get_reward refused the batch: %s", head, exc.message)
            raise
        logger.warning("%s/get_reward failed (%s), %d samples masked: %s", head, exc.kind.value, len(body["query"]),
                       exc.message)
        return masked(len(body["query"]), exc.kind.value)
    return reply
