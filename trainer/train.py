"""`gymserve train -c TRAIN.yaml`: TRL GRPOTrainer with gymserve rollouts and rewards.

Config (YAML; `key=value` overrides on the command line, dotted for nesting):

    head_url: http://127.0.0.1:11000      # where agents are found ($GYMSERVE_HEAD_URL if unset)
    model: embedded                       # a local HF folder, or `embedded` (SmolLM2-135M-Instruct)
    train_data: datasets/code_jaccard/example.jsonl   # JSONL of rows with agent_ref (or a list)
    eval_data: null
    output_dir: runs/smoke
    reward_components: []                 # names -> one reward function each (GDPO)
    reward_functions: auto                # auto | total | components | both
    rollout: {concurrency: 64, deadline_s: 900, retries: 2, sampling: {}}
    weight_sync: {enabled: auto, policy_server: null, max_policy_lag: 0}
    plot: true                            # reward.png in output_dir at the end
    progress: true                        # rich progress bar with the live reward
    grpo: {...}                           # any trl.GRPOConfig field

`metrics.jsonl` in `output_dir` gets one line per logging step (loss, reward, reward
components, KL, |Δlogp|, policy lag, ...) through `trainer.step_log.StepLog.record`;
`rollouts.jsonl` every rollout record as sampled (response, reward, `policy_version`);
the final weights go to `output_dir/final`.

Weight sync (see trainer/weight_sync.py): unless `grpo.use_vllm` is set (TRL syncs vLLM
itself), the trainer pushes its weights to the models/hf policy server before a rollout
batch whenever the server is more than `max_policy_lag` versions behind. `enabled: auto`
syncs when the head lists a models/hf server and warns loudly when it does not.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx

from .client import agent_name, default_head_url, run_sync
from .grpo import trainer_class
from .jsonl import JsonlAppender, read_complete_lines, read_rows
from .report import write_training_report
from .step_log import StepLog, plot
from .trl import make_rollout_func, reward_functions, to_trl_dataset
from .weight_sync import PolicyHooks, WeightSync, WeightSyncError, find_policy_server

log = logging.getLogger("gymserve.trainer")
ROLLOUTS = "rollouts.jsonl"


class TrainConfigError(ValueError):
    pass


@dataclass
class TrainConfig:
    output_dir: str
    train_data: list[str]
    model: str = "embedded"
    head_url: str | None = None
    eval_data: list[str] = field(default_factory=list)
    reward_components: list[str] = field(default_factory=list)
    reward_functions: str = "auto"
    rollout: dict[str, Any] = field(default_factory=dict)
    grpo: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    save_final: bool = True
    weight_sync: dict[str, Any] = field(default_factory=dict)
    plot: bool = True
    progress: bool = True


_ROLLOUT_KEYS = {"concurrency", "deadline_s", "retries", "sampling", "agents"}
_SYNC_KEYS = {"enabled", "policy_server", "max_policy_lag"}


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise TrainConfigError(f"override {dotted}: {key} is not a mapping")
    node[keys[-1]] = value


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
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise TrainConfigError(f"{path}: unknown keys {unknown} (known: {sorted(known)})")
    for key in ("output_dir", "train_data"):
        if not data.get(key):
            raise TrainConfigError(f"{path}: {key} is required")
    bad_rollout = sorted(set(data.get("rollout") or {}) - _ROLLOUT_KEYS)
    if bad_rollout:
        raise TrainConfigError(f"{path}: rollout: unknown keys {bad_rollout} (known: {sorted(_ROLLOUT_KEYS)})")
    bad_sync = sorted(set(data.get("weight_sync") or {}) - _SYNC_KEYS)
    if bad_sync:
        raise TrainConfigError(f"{path}: weight_sync: unknown keys {bad_sync} (known: {sorted(_SYNC_KEYS)})")
    sync = data.get("weight_sync") or {}
    if sync.get("enabled", "auto") not in ("auto", True, False):
        raise TrainConfigError(f"{path}: weight_sync.enabled must be auto, true or false")
    lag = sync.get("max_policy_lag", 0)
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
        raise TrainConfigError(f"{path}: weight_sync.max_policy_lag must be an integer >= 0")
    if data.get("reward_functions", "auto") not in ("auto", "total", "components", "both"):
        raise TrainConfigError(f"{path}: reward_functions must be auto, total, components or both")
    if isinstance(data.get("head_url"), str) and "${" in data["head_url"]:
        data["head_url"] = None  # an unset ${VAR}: fall back to $GYMSERVE_HEAD_URL / the default
    base = Path(path).resolve().parent
    for key in ("train_data", "eval_data"):
        data[key] = [_resolve(p, base) for p in data.get(key) or []]
    return TrainConfig(**data)


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


def grpo_args(config: TrainConfig):
    from trl import GRPOConfig

    known = {f.name for f in fields(GRPOConfig)}
    unknown = sorted(set(config.grpo) - known)
    if unknown:
        raise TrainConfigError(f"grpo: unknown GRPOConfig options {unknown}")
    options: dict[str, Any] = {"logging_steps": 1, "report_to": "none", "save_strategy": "no", "seed": config.seed,
                               **config.grpo, "output_dir": config.output_dir}
    import torch

    if not torch.cuda.is_available():
        options.setdefault("use_cpu", True)
        options.setdefault("bf16", False)
        options.setdefault("gradient_checkpointing", False)
    try:
        return GRPOConfig(**options)
    except (TypeError, ValueError) as exc:
        raise TrainConfigError(f"grpo: {exc}") from None


def _reward_funcs(config: TrainConfig, args: Any) -> list[Any]:
    mode = config.reward_functions
    comps = config.reward_components
    if mode == "auto":
        mode = "components" if comps and args.multi_objective_aggregation == "normalize_then_sum" else "total"
    if mode in ("components", "both") and len(comps) < 1:
        raise TrainConfigError("reward_functions: components needs reward_components")
    if mode == "total":
        return reward_functions()
    return reward_functions(comps, include_total=(mode == "both"))


def step_callback(step_log: StepLog):
    """A transformers TrainerCallback that hands every log record to `step_log.record`."""
    from transformers import TrainerCallback

    class _Callback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):  # noqa: D401 - transformers hook
            step_log.start()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                step_log.record(state.global_step, logs)

        def on_train_end(self, args, state, control, **kwargs):
            step_log.stop()

    return _Callback()


def weight_sync(config: TrainConfig, args: Any, head_url: str) -> WeightSync | None:
    """The policy server's weight sync, or None (vLLM path, disabled, or no models/hf server with `auto`)."""
    options = config.weight_sync or {}
    enabled = options.get("enabled", "auto")
    if enabled is False:
        return None
    if getattr(args, "use_vllm", False):
        log.info("use_vllm: TRL keeps vLLM's weights in sync; gymserve's weight sync is off")
        return None
    try:
        name, url = find_policy_server(head_url, options.get("policy_server"))
    except (WeightSyncError, httpx.HTTPError, ValueError) as exc:
        if enabled is True or options.get("policy_server"):
            raise TrainConfigError(f"weight_sync: {exc}") from None
        log.warning("NO WEIGHT SYNC (%s): the policy server keeps its initial weights and rollouts become "
                    "off-policy after the first step", exc)
        return None
    log.info("weight sync: policy server %s at %s, max_policy_lag=%d", name, url,
             int(options.get("max_policy_lag", 0)))
    return WeightSync(url, max_policy_lag=int(options.get("max_policy_lag", 0)), required=enabled is True)


def build_trainer(config: TrainConfig):
    """The GRPOTrainer for `config` (model loaded, datasets indexed, rollout func wired)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = grpo_args(config)
    if os.environ.get("GYMSERVE_TORCH_THREADS"):  # the same knob as the model servers' (busy small machines)
        import torch

        torch.set_num_threads(int(os.environ["GYMSERVE_TORCH_THREADS"]))
    train_rows = [row for path in config.train_data for row in read_rows(path)]
    eval_rows = [row for path in config.eval_data for row in read_rows(path)]
    if not train_rows:
        raise TrainConfigError("train_data has no rows")
    unroutable = [i for i, row in enumerate(train_rows + eval_rows, 1) if not agent_name(row)]
    if unroutable:
        raise TrainConfigError(f"{len(unroutable)} row(s) have no agent_ref.name (rows {unroutable[:10]}): "
                               "stamp it with `gymserve prepare --agent NAME`")
    path = model_path(config.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")
    rollout = dict(config.rollout)
    head_url = config.head_url or default_head_url()
    hooks = PolicyHooks(weight_sync(config, args, head_url))
    rollouts = JsonlAppender(Path(config.output_dir) / ROLLOUTS, truncate=True)  # every record, as sampled

    def keep(records: list[dict[str, Any]]) -> None:
        for record in records:
            rollouts.write(record)

    rollout_func = make_rollout_func(head_url, tokenizer, rows=train_rows + eval_rows, before_batch=hooks.before_batch,
                                     after_batch=hooks.after_batch, on_records=keep, **rollout)
    step_log = StepLog(config.output_dir, total=args.max_steps if args.max_steps > 0 else None,
                       progress=config.progress, head_url=head_url)
    trainer = trainer_class()(model=model, reward_funcs=_reward_funcs(config, args), args=args,
                              train_dataset=to_trl_dataset(train_rows),
                              eval_dataset=to_trl_dataset(eval_rows) if eval_rows else None,
                              processing_class=tokenizer, rollout_func=rollout_func,
                              callbacks=[step_callback(step_log)])
    if config.progress:  # the rich bar replaces transformers' tqdm bar and its printed dicts
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
    trainer.gymserve_sync = hooks.sync
    trainer.gymserve_rollouts = rollouts
    trainer.gymserve_client = rollout_func.client  # type: ignore[attr-defined]
    return trainer


def train(config: TrainConfig) -> dict[str, Any]:
    trainer = build_trainer(config)
    try:
        result = trainer.train()
    finally:
        trainer.gymserve_rollouts.close()
        run_sync(trainer.gymserve_client.aclose)  # its pooled connections, before the loop thread dies
    if trainer.gymserve_sync is not None:  # the policy server ends on the final weights
        trainer.gymserve_sync.push(trainer.accelerator.unwrap_model(trainer.model), int(result.global_step))
    metrics = Path(config.output_dir) / "metrics.jsonl"
    plot_path = None
    if config.plot:
        try:
            plot_path = str(plot(metrics, Path(config.output_dir) / "reward.png"))
        except ImportError:
            log.warning("no reward.png: matplotlib is not installed (pip install gymserve[ml])")
    records = read_complete_lines(Path(config.output_dir) / ROLLOUTS)
    report_path = str(write_training_report(config.output_dir, records))  # report.html: curves, rewards, failures
    final = Path(config.output_dir) / "final"
    if config.save_final:
        trainer.save_model(str(final))
        trainer.processing_class.save_pretrained(str(final))
    return {"global_step": result.global_step, "training_loss": result.training_loss,
            "metrics": str(metrics), "rollouts": str(Path(config.output_dir) / ROLLOUTS),
            "plot": plot_path, "report": report_path,
            "final_model": str(final) if config.save_final else None,
            "weights_version": trainer.gymserve_sync.server_version if trainer.gymserve_sync else None}
