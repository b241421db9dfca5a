"""Group-relative advantages (GRPO) and per-component normalized advantages (GDPO).

Semantics follow NeMo RL's `calculate_baseline_and_std_per_prompt` + GRPO advantage code,
so numbers computed offline (evaluation, debugging, custom trainers) match what NeMo RL
would train on. Pure numpy: no torch needed to use or test them.
"""
from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

import numpy as np


def _groups(group_ids: Sequence[Hashable], n: int) -> dict[Hashable, np.ndarray]:
    ids = list(group_ids)
    if len(ids) != n:
        raise ValueError(f"group_ids has {len(ids)} entries but there are {n} rewards")
    out: dict[Hashable, list[int]] = {}
    for i, gid in enumerate(ids):
        out.setdefault(_hashable(gid), []).append(i)
    return {gid: np.asarray(idx, dtype=np.int64) for gid, idx in out.items()}


def _hashable(value: Any) -> Hashable:
    if isinstance(value, np.ndarray):
        return tuple(value.tolist())
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


def baseline_and_std(rewards: Sequence[float], group_ids: Sequence[Hashable], *,
                     leave_one_out: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample baseline and Bessel-corrected std of its group (or of the others with leave-one-out).

    A group of one gets baseline = its reward (advantage 0) and std 0; a std over fewer
    than two values is 0 (NeMo RL turns the resulting NaN into 0 the same way).
    """
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    baseline = np.empty_like(r)
    std = np.zeros_like(r)
    for idx in _groups(group_ids, r.size).values():
        values = r[idx]
        if idx.size <= 1:
            baseline[idx] = values
            continue
        if leave_one_out:
            for j, i in enumerate(idx):
                others = np.delete(values, j)
                baseline[i] = others.mean()
                std[i] = others.std(ddof=1) if others.size > 1 else 0.0
        else:
            baseline[idx] = values.mean()
            std[idx] = values.std(ddof=1)
    return baseline, std


def compute_grpo_advantages(rewards: Sequence[float], group_ids: Sequence[Hashable], *,
                            leave_one_out: bool = False, normalize: bool = True, eps: float = 1e-6) -> np.ndarray:
    """`(r - baseline) / (std + eps)` per group; only `r - baseline` where std is 0 or `normalize` is off."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    baseline, std = baseline_and_std(r, group_ids, leave_one_out=leave_one_out)
    adv = r - baseline
    if normalize:
        nonzero = std > 0
        adv[nonzero] = adv[nonzero] / (std[nonzero] + eps)
    return adv


def compute_gdpo_advantages(components: Mapping[str, Sequence[float]], group_ids: Sequence[Hashable], *,
                            weights: Mapping[str, float] | Sequence[float] | None = None,
                            leave_one_out: bool = False, normalize: bool = True, eps: float = 1e-6,
                            batch_eps: float = 0.0) -> np.ndarray:
    """GDPO: normalize each reward component within its group, sum (weighted, in sorted name
    order), then normalize the sum over the whole batch (sample std, `batch_eps`; where that
    std is 0 only the mean is subtracted).

    With `eps=1e-4, batch_eps=1e-4` this equals TRL's `multi_objective_aggregation="normalize_then_sum"`.
    """
    if len(components) < 2:
        raise ValueError(f"GDPO needs at least 2 reward components, got {len(components)}: {sorted(components)}")
    names = sorted(components)
    if weights is None:
        w = {name: 1.0 for name in names}
    elif isinstance(weights, Mapping):
        missing = [name for name in names if name not in weights]
        if missing:
            raise ValueError(f"weights: missing components {missing}")
        w = {name: float(weights[name]) for name in names}
    else:
        seq = list(weights)
        if len(seq) != len(names):
            raise ValueError(f"weights: {len(seq)} values for {len(names)} components (sorted: {names})")
        w = dict(zip(names, map(float, seq)))
    lengths = {name: len(components[name]) for name in names}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"components have different lengths: {lengths}")
    total = np.zeros(next(iter(lengths.values())), dtype=np.float64)
    for name in names:
        total += w[name] * compute_grpo_advantages(components[name], group_ids, leave_one_out=leave_one_out,
                                                   normalize=normalize, eps=eps)
    centered = total - total.mean()
    batch_std = total.std(ddof=1) if total.size > 1 else 0.0
    if batch_std > 0:
        return centered / (batch_std + batch_eps)
    return centered


ESTIMATORS = ("nemo_rl_grpo", "leave_one_out", "gdpo")


def compute_advantages(estimator: str, rewards: Sequence[float], group_ids: Sequence[Hashable], *,
                       components: Mapping[str, Sequence[float]] | None = None,
                       weights: Mapping[str, float] | None = None) -> np.ndarray:
    """The advantage of every sample under `estimator` (the `grpo.advantage` key):

    - `nemo_rl_grpo`: NeMo RL's GRPO as its math config runs it: leave-one-out baseline,
      divided by the (leave-one-out, Bessel) std where that std is > 0;
    - `leave_one_out`: RLOO: the leave-one-out baseline alone (NeMo RL's `normalize_rewards: false`);
    - `gdpo`: `compute_gdpo_advantages` over `components` (per-component group normalization,
      weighted sum, batch normalization).

    A NaN reward (a sample no reward function could score) gets advantage 0 and stays out
    of every baseline and std, as NeMo RL's `valid_mask` keeps it out.
    """
    r = np.asarray(rewards, dtype=np.float64).reshape(-1)
    ids = list(group_ids)
    if estimator == "gdpo":
        if not components:
            raise ValueError("gdpo needs reward components")
        columns = {name: np.asarray(values, dtype=np.float64).reshape(-1) for name, values in components.items()}
        valid = ~np.any([np.isnan(c) for c in columns.values()], axis=0)
    elif estimator in ("nemo_rl_grpo", "leave_one_out"):
        valid = ~np.isnan(r)
    else:
        raise ValueError(f"unknown advantage estimator {estimator!r} (known: {', '.join(ESTIMATORS)})")
    out = np.zeros(r.size if estimator != "gdpo" else valid.size, dtype=np.float64)
    if not valid.any():
        return out
    kept = [gid for gid, ok in zip(ids, valid) if ok]
    if estimator == "gdpo":
        out[valid] = compute_gdpo_advantages({n: c[valid] for n, c in columns.items()}, kept, weights=weights)
    else:
        out[valid] = compute_grpo_advantages(r[valid], kept, leave_one_out=True,
                                             normalize=(estimator == "nemo_rl_grpo"))
    return out
