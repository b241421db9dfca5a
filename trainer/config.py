"""`gymserve train` configuration: typed sub-configs, YAML loading, `key=value` overrides.

A training YAML is validated here once, so every mistake (an unknown key, a negative lag,
an estimator that does not exist) is a `TrainConfigError` naming the key before a model
is loaded. `grpo` holds our GRPO options under NeMo RL's names (see docs/grpo-options.md)
and passes every other key to `trl.GRPOConfig` unchanged.
"""
from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError, field_validator,
                      model_validator)

ADVANTAGES = ("trl", "nemo_rl_grpo", "leave_one_out", "gdpo")
Advantage = Literal["trl", "nemo_rl_grpo", "leave_one_out", "gdpo"]


class TrainConfigError(ValueError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RolloutConfig(_Strict):
    """How rollouts are collected through the head (trainer.trl.make_rollout_func's options)."""

    concurrency: StrictInt = Field(64, ge=1)
    deadline_s: float = Field(900.0, gt=0)
    retries: StrictInt = Field(2, ge=0)
    sampling: dict[str, Any] = Field(default_factory=dict)
    agents: dict[str, str] | None = None


class WeightSyncConfig(_Strict):
    """Weight pushes to the models/hf policy server (trainer.weight_sync)."""

    enabled: Literal["auto"] | StrictBool = "auto"
    policy_server: str | None = None
    max_policy_lag: StrictInt = Field(0, ge=0)
    # true: train on purpose with a policy server whose weights cannot be updated (rollouts off-policy
    # after the first step); turns the importance-sampling correction on. Otherwise that is an error.
    off_policy: StrictBool = False
    # after every push, the largest |Δlogp| allowed between the server's and the trainer's logprobs of a
    # few sampled tokens (null: no check); above it training stops
    check_tolerance: float | None = Field(1e-3, gt=0)


class LoraConfig(_Strict):
    """A LoRA adapter (peft) trained instead of the whole model; the policy server gets merged weights."""

    enabled: StrictBool = False
    r: StrictInt = Field(16, ge=1)  # NeMo RL: dim
    alpha: StrictInt = Field(32, ge=1)  # scaling = alpha / r
    dropout: float = Field(0.0, ge=0, lt=1)
    # module names (suffixes) to wrap, or "all-linear"; None: peft's default for the model type
    target_modules: list[Annotated[str, Field(min_length=1)]] | Literal["all-linear"] | None = None

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, value: list[str] | str | None) -> list[str] | str | None:
        if isinstance(value, list) and not value:
            raise ValueError("give at least one module name, or leave the key out for peft's default")
        return value


# Our names for the GRPO guide's options -> the trl.GRPOConfig field each one sets.
_TRL_ALIASES = {"overlong_filtering": "mask_truncated_completions", "ratio_clip_c": "delta",
                "use_on_policy_kl_approximation": "use_bias_correction_kl"}


class GrpoConfig(BaseModel):
    """GRPO options. The typed fields are ours; any other key is a `trl.GRPOConfig` field."""

    model_config = ConfigDict(extra="allow")

    advantage: Advantage = "trl"
    use_importance_sampling_correction: StrictBool | None = None  # None: on when max_policy_lag > 0
    truncated_importance_sampling_ratio: float = Field(2.0, gt=0)
    overlong_filtering: StrictBool | None = None
    ratio_clip_c: float | None = Field(None, gt=1)
    use_on_policy_kl_approximation: StrictBool | None = None
    val_period: StrictInt | None = Field(None, ge=1)  # evaluate every this-many steps (TRL eval_steps)

    @model_validator(mode="after")
    def _one_name_per_option(self) -> GrpoConfig:
        extra = self.model_extra or {}
        for ours, theirs in {**_TRL_ALIASES, "val_period": "eval_steps"}.items():
            if getattr(self, ours) is not None and theirs in extra:
                raise ValueError(f"{ours} and {theirs} set the same TRL option: keep one")
        return self

    def trl_options(self) -> dict[str, Any]:
        """The `trl.GRPOConfig` keyword arguments: the extra keys plus our aliases that are set."""
        options = dict(self.model_extra or {})
        for ours, theirs in _TRL_ALIASES.items():
            if getattr(self, ours) is not None:
                options[theirs] = getattr(self, ours)
        if self.val_period is not None:
            options.setdefault("eval_strategy", "steps")
            options["eval_steps"] = self.val_period
        return options


class TrainConfig(_Strict):
    output_dir: str
    train_data: list[str]
    # rollout_func: agents' /run through the head; environment_factory: TRL generates, resource servers
    # give tools and reward (trainer/environment_factory.py), each row's `environment` or `environment`
    mode: Literal["rollout_func", "environment_factory"] = "rollout_func"
    environment: str | None = None
    model: str = "embedded"
    head_url: str | None = None
    eval_data: list[str] = Field(default_factory=list)
    split_validation_size: float = Field(0, ge=0)  # rows (>= 1) or a fraction (< 1) of train_data held out
    # prompts each step takes from each train_data file, in order (NeMo RL's num_prompts_per_dataloader)
    num_prompts_per_dataset: list[Annotated[StrictInt, Field(ge=1)]] = Field(default_factory=list)
    reward_components: list[str] = Field(default_factory=list)
    reward_functions: Literal["auto", "total", "components", "both"] = "auto"
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    grpo: GrpoConfig = Field(default_factory=GrpoConfig)
    seed: int = 0
    save_final: bool = True
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    plot: bool = True
    progress: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.grpo.advantage == "gdpo" and len(self.reward_components) < 2:
            raise ValueError("grpo.advantage gdpo needs at least 2 reward_components")
        if self.split_validation_size >= 1 and self.split_validation_size != int(self.split_validation_size):
            raise ValueError("split_validation_size: a number of rows (>= 1) or a fraction below 1")
        if self.num_prompts_per_dataset and len(self.num_prompts_per_dataset) != len(self.train_data):
            raise ValueError(f"num_prompts_per_dataset: one count per train_data file ({len(self.train_data)}), "
                             f"got {len(self.num_prompts_per_dataset)}")
        return self

    def importance_sampling(self) -> bool:
        """Truncated importance sampling against the sampler's logprobs: explicit, else on when lag > 0."""
        explicit = self.grpo.use_importance_sampling_correction
        off_policy = self.weight_sync.max_policy_lag > 0 or self.weight_sync.off_policy
        return explicit if explicit is not None else off_policy


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise TrainConfigError(f"override {dotted}: {key} is not a mapping")
    node[keys[-1]] = value


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "config"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def load_config(path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    import yaml

    from services.core.config import load_yaml

    try:
        data = load_yaml(os.path.expandvars(Path(path).read_text())) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise TrainConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise TrainConfigError(f"{path}: expected a mapping")
    for item in overrides or []:
        if "=" not in item:
            raise TrainConfigError(f"override {item!r}: expected key=value")
        key, _, raw = item.partition("=")
        _set_dotted(data, key.strip(), load_yaml(raw) if raw else raw)
    for key in ("train_data", "eval_data", "reward_components"):
        if isinstance(data.get(key), str):
            data[key] = [data[key]]
    for key in ("output_dir", "train_data"):
        if not data.get(key):
            raise TrainConfigError(f"{path}: {key} is required")
    if isinstance(data.get("head_url"), str) and "${" in data["head_url"]:
        data["head_url"] = None  # an unset ${VAR}: fall back to $GYMSERVE_HEAD_URL / the default
    base = Path(path).resolve().parent
    for key in ("train_data", "eval_data"):
        if isinstance(data.get(key), list):
            data[key] = [_resolve(p, base) if isinstance(p, str) else p for p in data[key]]
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise TrainConfigError(f"{path}: {_describe(exc)}") from None


def _resolve(path: str, base: Path) -> str:
    """Relative data paths: as given if they exist from the working directory, else next to the config."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return str(p)
    return str(base / p) if (base / p).exists() else str(p)


def model_path(name: str) -> str:
    if name in ("embedded", "", None):
        from services.models.hf.embedded import embedded_model_dir

        return str(embedded_model_dir())
    return name


def grpo_args(config: TrainConfig) -> Any:
    """The `trl.GRPOConfig` for `config` (CPU-safe defaults when there is no GPU)."""
    from trl import GRPOConfig

    trl_options = config.grpo.trl_options()
    known = {f.name for f in fields(GRPOConfig)}
    unknown = sorted(set(trl_options) - known)
    if unknown:
        raise TrainConfigError(f"grpo: unknown options {unknown} (ours: {sorted(GrpoConfig.model_fields)}; "
                               "any other key must be a trl.GRPOConfig field)")
    options: dict[str, Any] = {"logging_steps": 1, "report_to": "none", "save_strategy": "no", "seed": config.seed,
                               **trl_options, "output_dir": config.output_dir}
    if config.num_prompts_per_dataset:  # trainer/data.py lays the rows out step by step: keep that order
        options["shuffle_dataset"] = False
    import torch

    if not torch.cuda.is_available():
        options.setdefault("use_cpu", True)
        options.setdefault("bf16", False)
        options.setdefault("gradient_checkpointing", False)
    try:
        args = GRPOConfig(**options)
    except (TypeError, ValueError) as exc:
        raise TrainConfigError(f"grpo: {exc}") from None
    per_step = int(args.generation_batch_size or 0) // int(args.num_generations or 1)
    if config.num_prompts_per_dataset and sum(config.num_prompts_per_dataset) != per_step:
        raise TrainConfigError(f"num_prompts_per_dataset adds up to {sum(config.num_prompts_per_dataset)} prompts, "
                               f"but a step takes {per_step} (generation batch {args.generation_batch_size} / "
                               f"num_generations {args.num_generations})")
    return args
