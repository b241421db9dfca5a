"""Plain data of a generation (no torch import: the proxy uses these too)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    top_logprobs: int = 0  # alternatives per position (0: only the sampled token's logprob)


@dataclass
class Generation:
    """One sampled continuation. `token_ids` are exactly the sampled tokens (eos/stop included)."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    text: str
    finish_reason: str  # "stop" | "length"
    policy_version: int | None = None  # the engine's weights_version that sampled every token (None: unknown,
    #                                    e.g. an upstream behind the proxy)
