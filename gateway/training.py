"""Training curves on the head: `POST /training/metrics` takes one record per trainer step,
`GET /training/metrics` gives them back, and the dashboard draws them.

The trainer pushes (see `trainer/training_feed.py`) because a training job is a client,
not a server the head could sample. Records live in memory, bounded three ways: runs, steps per
run, and bytes over all of them (the oldest steps go first); a record's names are short and its
maps stay within their entry caps when a repeated step merges into them. The trainer's own
`metrics.jsonl` stays the record of truth.
"""
from __future__ import annotations

import collections
import json
import math
import time
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from services.core.errors import BadRequest

MAX_RUNS = 16
MAX_STEPS_PER_RUN = 20_000
MAX_BYTES = 64 * 1024 * 1024  # all records together, as JSON
MAX_NAME_CHARS = 200  # a component's, environment's or metric's name
# entries a step's maps may hold, also after a repeated step merged into them
MAP_LIMITS = {"reward_components": 64, "env_rewards": 64, "mismatch": 16}
Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS)]


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
    reward_components: dict[Name, float] = Field(default_factory=dict, max_length=MAP_LIMITS["reward_components"])
    env_rewards: dict[Name, float] = Field(default_factory=dict, max_length=MAP_LIMITS["env_rewards"],
                                           description="mean reward per environment (agent name) in a blended run")
    mismatch: dict[Name, float] = Field(default_factory=dict, max_length=MAP_LIMITS["mismatch"],
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

    def __init__(self, max_runs: int = MAX_RUNS, max_steps: int = MAX_STEPS_PER_RUN, max_bytes: int = MAX_BYTES) -> None:
        self.max_runs = max_runs
        self.max_steps = max_steps
        self.max_bytes = max_bytes
        self._runs: collections.OrderedDict[str, collections.OrderedDict[int, dict[str, Any]]] = \
            collections.OrderedDict()
        self._sizes: dict[tuple[str, int], int] = {}  # each record's size as JSON
        self.bytes = 0
        self.version = 0  # grows with every record (lets readers cache what they built)

    def add(self, step: TrainingStep) -> None:
        """Records `step`; raises `BadRequest` (422) when merging it into an earlier record of the same
        step would take one of its maps past its entry cap."""
        record = step.model_dump()
        if record["time"] is None:
            record["time"] = time.time()
        earlier = self._runs.get(step.run, {}).get(step.step)
        if earlier is not None:  # a second log record of a step (e.g. the trainer's summary) adds to it
            merged = {**earlier, **{k: v for k, v in record.items() if v is not None}}
            for key, limit in MAP_LIMITS.items():
                merged[key] = {**earlier[key], **record[key]}
                if len(merged[key]) > limit:
                    raise BadRequest(f"{key}: step {step.step} of run {step.run!r} would hold {len(merged[key])} "
                                     f"entries with the earlier record's; at most {limit}", status_code=422)
            record = merged
        self.version += 1
        steps = self._runs.pop(step.run, None) or collections.OrderedDict()
        self._forget(step.run, steps, step.step)
        steps[step.step] = record
        size = len(json.dumps(record))
        self._sizes[(step.run, step.step)] = size
        self.bytes += size
        self._runs[step.run] = steps  # most recently updated run last
        while len(steps) > self.max_steps:
            self._forget(step.run, steps, next(iter(steps)))
        while len(self._runs) > self.max_runs:
            self._drop_run(next(iter(self._runs)))
        while self.bytes > self.max_bytes and self._runs:  # the least recently updated run's oldest steps go
            oldest = next(iter(self._runs))
            self._forget(oldest, self._runs[oldest], next(iter(self._runs[oldest])))
            if not self._runs[oldest]:
                del self._runs[oldest]

    def _forget(self, run: str, steps: collections.OrderedDict[int, dict[str, Any]], step: int) -> None:
        if steps.pop(step, None) is not None:
            self.bytes -= self._sizes.pop((run, step))

    def _drop_run(self, run: str) -> None:
        for step in list(self._runs.pop(run)):
            self.bytes -= self._sizes.pop((run, step))

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
