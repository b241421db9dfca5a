"""Training curves on the head: `POST /training/metrics` takes one record per trainer step,
`GET /training/metrics` gives them back, and the dashboard draws them.

The trainer pushes (see `trainer/training_feed.py`) because a training job is a client,
not a server the head could sample. Records live in memory, a bounded number per run:
the trainer's own `metrics.jsonl` stays the record of truth.
"""
from __future__ import annotations

import collections
import math
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_RUNS = 16
MAX_STEPS_PER_RUN = 20_000


def _finite(value: float | None, field_name: str) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{field_name} must be a finite number")
    return value


class TrainingStep(BaseModel):
    """One trainer step (or logging step): what the dashboard's training charts show."""

    model_config = ConfigDict(extra="forbid")

    run: str = Field("default", min_length=1, max_length=200, description="training run name (output_dir)")
    step: int = Field(ge=0, description="trainer global step")
    reward: float | None = Field(None, description="mean reward of the step's judged rollouts")
    reward_std: float | None = None
    kl: float | None = Field(None, description="KL divergence to the reference policy")
    loss: float | None = None
    learning_rate: float | None = Field(None, ge=0)
    masked: int | None = Field(None, ge=0, description="rollouts masked as infrastructure failures")
    policy_version: int | None = Field(None, ge=0)
    reward_components: dict[str, float] = Field(default_factory=dict, max_length=64)
    env_rewards: dict[str, float] = Field(default_factory=dict, max_length=64,
                                          description="mean reward per environment (agent name) in a blended run")
    mismatch: dict[str, float] = Field(default_factory=dict, max_length=16,
                                       description="sampler/trainer mismatch metrics (token_mult_prob_error, "
                                                   "gen_kl_error, policy_kl_error, js_divergence_error, "
                                                   "sampling_importance_ratio)")
    time: float | None = Field(None, description="unix time of the step; the head's clock if absent")

    @field_validator("reward", "reward_std", "kl", "loss", "learning_rate")
    @classmethod
    def _finite_numbers(cls, value: float | None, info: Any) -> float | None:
        return _finite(value, info.field_name)

    @field_validator("reward_components", "env_rewards", "mismatch")
    @classmethod
    def _finite_components(cls, value: dict[str, float], info: Any) -> dict[str, float]:
        for name, number in value.items():
            _finite(number, f"{info.field_name}.{name}")
        return value


class TrainingLog:
    """The latest runs' step records, oldest first; a repeated step's fields update the earlier record."""

    def __init__(self, max_runs: int = MAX_RUNS, max_steps: int = MAX_STEPS_PER_RUN) -> None:
        self.max_runs = max_runs
        self.max_steps = max_steps
        self._runs: collections.OrderedDict[str, collections.OrderedDict[int, dict[str, Any]]] = \
            collections.OrderedDict()
        self.version = 0  # grows with every record (lets readers cache what they built)

    def add(self, step: TrainingStep) -> None:
        self.version += 1
        record = step.model_dump()
        if record["time"] is None:
            record["time"] = time.time()
        steps = self._runs.pop(step.run, None) or collections.OrderedDict()
        earlier = steps.pop(step.step, None)
        if earlier is not None:  # a second log record of a step (e.g. the trainer's summary) adds to it
            merged = {**earlier, **{k: v for k, v in record.items() if v is not None}}
            for key in ("reward_components", "env_rewards", "mismatch"):
                merged[key] = {**earlier[key], **record[key]}
            record = merged
        steps[step.step] = record
        while len(steps) > self.max_steps:
            steps.popitem(last=False)
        self._runs[step.run] = steps  # most recently updated run last
        while len(self._runs) > self.max_runs:
            self._runs.popitem(last=False)

    def runs(self) -> list[str]:
        """Run names, most recently updated last."""
        return list(self._runs)

    def records(self, run: str | None = None) -> list[dict[str, Any]]:
        """Step records by step (every run's, runs in update order, when `run` is None)."""
        runs: list[dict[int, dict[str, Any]]] = \
            list(self._runs.values()) if run is None else [self._runs.get(run, {})]
        return [r for steps in runs for r in sorted(steps.values(), key=lambda r: r["step"])]

    def latest_run(self) -> str | None:
        return next(reversed(self._runs), None)
