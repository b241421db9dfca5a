"""Sampler/trainer mismatch metrics and the truncated importance-sampling weights.

`generation` are the logprobs our policy server reported when it sampled each token,
`trainer` the trainer's logprobs of the same tokens before the update (NeMo RL's
`generation_logprobs` and `prev_logprobs`). The formulas are NeMo RL's ClippedPGLossFn
metrics, each a mean over the masked tokens whose generation logprob is known:

- `token_mult_prob_error`: mean exp(|trainer - generation|) (1.0 when they agree);
- `gen_kl_error`: KL(P_gen || P_train), k3 estimator with log-ratio trainer - generation;
- `policy_kl_error`: KL(P_train || P_gen), k3 estimator with log-ratio generation - trainer;
- `js_divergence_error`: Jensen-Shannon divergence through the per-token mixture;
- `sampling_importance_ratio`: mean exp(trainer - generation), after truncation when a cap is given.

Each is 0 (1 for the two ratios) with identical logprobs; `deviations` gives their
distance from that, which `MISMATCH_WARN` bounds.
"""
from __future__ import annotations

from typing import Any

MISMATCH_KEYS = ("token_mult_prob_error", "gen_kl_error", "policy_kl_error", "js_divergence_error",
                 "sampling_importance_ratio")
MISMATCH_WARN = 1e-3
_RATIOS = ("token_mult_prob_error", "sampling_importance_ratio")


def _k3(log_ratio: Any) -> Any:
    import torch

    return torch.exp(log_ratio) - log_ratio - 1


def known_mask(generation: Any, mask: Any) -> Any:
    """The loss mask restricted to tokens whose generation logprob is a number."""
    import torch

    return mask.bool() & torch.isfinite(generation)


def importance_weights(trainer: Any, generation: Any, mask: Any, cap: float | None) -> Any:
    """Per-token exp(trainer - generation), truncated at `cap` (NeMo RL's `tis`); 1 where unknown."""
    import torch

    keep = known_mask(generation, mask)
    log_ratio = torch.where(keep, trainer.float() - torch.nan_to_num(generation.float()), torch.zeros_like(trainer.float()))
    weights = torch.nan_to_num(torch.exp(log_ratio), nan=0.0, posinf=0.0, neginf=0.0)
    if cap is not None:
        weights = torch.clamp(weights, max=cap)
    return torch.where(keep, weights, torch.ones_like(weights))


def mismatch_metrics(trainer: Any, generation: Any, mask: Any, *, cap: float | None = None) -> dict[str, float]:
    """The five metrics over the masked tokens with a known generation logprob ({} when there are none)."""
    import torch

    keep = known_mask(generation, mask)
    if not bool(keep.any()):
        return {}
    prev = trainer.double()[keep]  # float64: the KLs of nearly equal logprobs are differences of ~1e-7
    gen = generation.double()[keep]
    log_mixture = torch.log(0.5 * torch.exp(prev) + 0.5 * torch.exp(gen))
    js = 0.5 * _k3(prev - log_mixture) + 0.5 * _k3(gen - log_mixture)
    weights = importance_weights(trainer, generation, mask, cap)[keep]
    return {"token_mult_prob_error": float(torch.exp((prev - gen).abs()).mean()),
            "gen_kl_error": float(_k3(prev - gen).mean()),
            "policy_kl_error": float(_k3(gen - prev).mean()),
            "js_divergence_error": float(js.mean()),
            "sampling_importance_ratio": float(weights.mean())}


def deviations(metrics: dict[str, float]) -> dict[str, float]:
    """How far each metric is from perfect agreement (0 for the KLs, 1 for the two ratios)."""
    return {key: abs(value - 1.0) if key in _RATIOS else abs(value)
            for key, value in metrics.items() if key in MISMATCH_KEYS}


def exceeding(metrics: dict[str, float], threshold: float = MISMATCH_WARN) -> dict[str, float]:
    """The metrics whose deviation exceeds `threshold` (what the trainer warns about)."""
    return {key: metrics[key] for key, dev in deviations(metrics).items() if dev > threshold}
