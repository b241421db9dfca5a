"""Training rows: the config's files read and blended, a validation split, routing checked.

Several `train_data` files (one per environment, say) become one blended dataset: their rows
are concatenated here and TRL's sampler shuffles them together (seeded). With
`split_validation_size`, a seeded sample of those rows is held out as the validation set
(NeMo RL's key: a fraction below 1, or a number of rows) and never trained on.
"""
from __future__ import annotations

import random
from typing import Any

from .client import agent_name
from .config import TrainConfig, TrainConfigError
from .jsonl import read_rows


def split_validation(rows: list[dict[str, Any]], size: float, seed: int) -> tuple[list[dict[str, Any]],
                                                                                  list[dict[str, Any]]]:
    """(train, validation): `size` rows (or that fraction, at least one) drawn with `seed`; train keeps its order."""
    count = max(1, round(size * len(rows))) if size < 1 else int(size)
    if count >= len(rows):
        raise TrainConfigError(f"split_validation_size {size} leaves no training rows out of {len(rows)}")
    held = set(random.Random(seed).sample(range(len(rows)), count))
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def load_rows(config: TrainConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train rows, evaluation rows) for `config`; every row must name its agent."""
    train_rows = [row for path in config.train_data for row in read_rows(path)]
    eval_rows = [row for path in config.eval_data for row in read_rows(path)]
    if not train_rows:
        raise TrainConfigError("train_data has no rows")
    if config.split_validation_size:
        if eval_rows:
            raise TrainConfigError("split_validation_size and eval_data both give a validation set: keep one")
        train_rows, eval_rows = split_validation(train_rows, config.split_validation_size, config.seed)
    unroutable = [i for i, row in enumerate(train_rows + eval_rows, 1) if not agent_name(row)]
    if unroutable:
        raise TrainConfigError(f"{len(unroutable)} row(s) have no agent_ref.name (rows {unroutable[:10]}): "
                               "stamp it with `gymserve prepare --agent NAME`")
    return train_rows, eval_rows
