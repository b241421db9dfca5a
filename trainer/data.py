"""Training rows: the config's files read and blended, a validation split, routing checked.

Several `train_data` files (one per environment, say) become one blended dataset: their rows
are concatenated here and TRL's sampler shuffles them together (seeded). With
`split_validation_size`, a seeded sample of those rows is held out as the validation set
(NeMo RL's key: a fraction below 1, or a number of rows) and never trained on.

With `num_prompts_per_dataset` (one count per file), every step takes exactly that many
prompts from each file: the rows are laid out step by step (each file shuffled with the seed,
smaller files cycled until the one that needs the most steps is used up) and TRL's sampler
keeps that order.
"""
from __future__ import annotations

import math
import random
from typing import Any, TypeVar

from .client import agent_name
from .config import TrainConfig, TrainConfigError
from .jsonl import read_rows

T = TypeVar("T")


def split_validation(rows: list[T], size: float, seed: int) -> tuple[list[T], list[T]]:
    """(train, validation): `size` rows (or that fraction, at least one) drawn with `seed`; train keeps its order."""
    count = max(1, round(size * len(rows))) if size < 1 else int(size)
    if count >= len(rows):
        raise TrainConfigError(f"split_validation_size {size} leaves no training rows out of {len(rows)}")
    held = set(random.Random(seed).sample(range(len(rows)), count))
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def quota_order(per_file: list[list[dict[str, Any]]], quotas: list[int], seed: int) -> list[dict[str, Any]]:
    """Rows laid out in steps of `quotas[i]` rows of file i each (files shuffled with `seed`, cycled)."""
    rng = random.Random(seed)
    pools = [rng.sample(rows, len(rows)) for rows in per_file]
    for i, pool in enumerate(pools):
        if not pool:
            raise TrainConfigError(f"num_prompts_per_dataset: train_data file {i + 1} has no training rows")
    steps = max(math.ceil(len(pool) / quota) for pool, quota in zip(pools, quotas))
    out: list[dict[str, Any]] = []
    for step in range(steps):
        for pool, quota in zip(pools, quotas):
            out.extend(pool[(step * quota + k) % len(pool)] for k in range(quota))
    return out


def load_rows(config: TrainConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, evaluation rows) for `config`; every row must name its agent."""
    tagged = [(i, row) for i, path in enumerate(config.train_data) for row in read_rows(path)]
    eval_rows = [row for path in config.eval_data for row in read_rows(path)]
    if not tagged:
        raise TrainConfigError("train_data has no rows")
    if config.split_validation_size:
        if eval_rows:
            raise TrainConfigError("split_validation_size and eval_data both give a validation set: keep one")
        tagged, held = split_validation(tagged, config.split_validation_size, config.seed)
        eval_rows = [row for _, row in held]
    train_rows = [row for _, row in tagged]
    if config.num_prompts_per_dataset:
        per_file = [[row for i, row in tagged if i == k] for k in range(len(config.train_data))]
        train_rows = quota_order(per_file, config.num_prompts_per_dataset, config.seed)
    unroutable = [i for i, row in enumerate(train_rows + eval_rows, 1) if not agent_name(row)]
    if unroutable:
        raise TrainConfigError(f"{len(unroutable)} row(s) have no agent_ref.name (rows {unroutable[:10]}): "
                               "stamp it with `gymserve prepare --agent NAME`")
    return train_rows, eval_rows
