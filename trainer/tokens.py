"""Multi-turn token stitching: one trajectory's model calls -> prompt ids, completion ids,
logprobs and a mask of which completion tokens the model generated.

Each model call's last output item carries `prompt_token_ids`, `generation_token_ids` and
`generation_log_probs`. By the model servers' continuity rule the prompt of call k+1 starts
with prompt + generation of call k; the tokens after that prefix (tool outputs, user turns,
template tokens) join the completion with mask 0 and logprob 0. A trajectory that breaks
the rule cannot be trained on faithfully and is reported, never silently re-tokenized.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class StitchError(ValueError):
    """The trajectory's token data is missing or inconsistent."""


@dataclass
class Stitched:
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    env_mask: list[int] = field(default_factory=list)
    num_calls: int = 0


def model_calls(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The items that close a model call (they carry the training token fields), in order."""
    return [item for item in output
            if isinstance(item, dict) and item.get("generation_token_ids") is not None
            and item.get("prompt_token_ids") is not None]


def stitch(response: dict[str, Any]) -> Stitched:
    output = response.get("output") if isinstance(response, dict) else None
    calls = model_calls(output or [])
    if not calls:
        raise StitchError("the response has no training token ids (prompt_token_ids/generation_token_ids): "
                          "is the model server in training mode?")
    first = calls[0]
    result = Stitched(prompt_ids=[int(t) for t in first["prompt_token_ids"]])
    previous: list[int] = []
    for k, call in enumerate(calls):
        prompt = [int(t) for t in call["prompt_token_ids"]]
        gen = [int(t) for t in call["generation_token_ids"]]
        logps = call.get("generation_log_probs")
        logps = [float(x) for x in logps] if logps is not None else [0.0] * len(gen)
        if len(logps) != len(gen):
            raise StitchError(f"model call {k + 1}: {len(gen)} generated tokens but {len(logps)} logprobs")
        if call.get("token_continuity_broken"):
            raise StitchError(f"model call {k + 1}: the model server flagged token_continuity_broken")
        if k > 0:
            if prompt[: len(previous)] != previous:
                raise StitchError(f"model call {k + 1}: its prompt ids do not start with the previous call's "
                                  f"prompt + generated ids (token continuity broken)")
            new = prompt[len(previous):]
            result.completion_ids += new
            result.logprobs += [0.0] * len(new)
            result.env_mask += [0] * len(new)
        result.completion_ids += gen
        result.logprobs += logps
        result.env_mask += [1] * len(gen)
        previous = prompt + gen
    result.num_calls = len(calls)
    if not result.completion_ids:
        raise StitchError("the model generated no tokens")
    return result


def policy_version(response: Any) -> int | None:
    """The oldest `policy_version` among a response's model calls (None when no call reports one):
    a rollout is as stale as its oldest tokens."""
    output = response.get("output") if isinstance(response, dict) else None
    versions = [int(call["policy_version"]) for call in model_calls(output or [])
                if isinstance(call.get("policy_version"), int)]
    return min(versions) if versions else None
