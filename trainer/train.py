"""`gymserve train -c TRAIN.yaml`: TRL GRPOTrainer with gymserve rollouts and rewards.

Config (YAML; `key=value` overrides on the command line, dotted for nesting):

    head_url: http://127.0.0.1:11000      # where agents are found ($GYMSERVE_HEAD_URL if unset)
    mode: rollout_func                    # or environment_factory (trainer/environment_factory.py)
    environment: null                     # environment_factory: resource server of rows without `environment`
    model: embedded                       # a local HF folder, or `embedded` (SmolLM2-135M-Instruct)
    train_data: datasets/code_jaccard/example.jsonl   # JSONL of rows with agent_ref (or a list)
    eval_data: null
    num_prompts_per_dataset: []           # prompts per train_data file in every step (trainer/data.py)
    output_dir: runs/smoke
    reward_components: []                 # names -> one reward function each (GDPO)
    reward_functions: auto                # auto | total | components | both
    rollout: {concurrency: 64, deadline_s: 900, retries: 2, sampling: {}}
    weight_sync: {enabled: auto, policy_server: null, max_policy_lag: 0, off_policy: false, check_tolerance: 1.0e-3}
    lora: {enabled: false, r: 16, alpha: 32, dropout: 0.0, target_modules: null}  # trainer/lora.py
    plot: true                            # reward.png in output_dir at the end
    progress: true                        # rich progress bar with the live reward
    grpo: {advantage: trl, ...}           # our GRPO options (trainer/config.py) + any trl.GRPOConfig field

The config is validated in trainer/config.py; the trainer subclass (advantage estimators,
mismatch metrics, importance-sampling correction) is trainer/grpo.py.
`metrics.jsonl` in `output_dir` gets one line per logging step (loss, reward, reward
components, per-environment reward, KL, mismatch metrics, policy lag, ...) through `trainer.step_log.StepLog.record`;
`rollouts.jsonl` every rollout record as sampled (response, reward, `policy_version`);
the final weights go to `output_dir/final` (with LoRA: the adapter, peft's format).

Weight sync (see trainer/weight_sync.py): unless `grpo.use_vllm` is set (TRL syncs vLLM
itself), the trainer pushes its weights to the models/vllm or models/hf policy server before a
rollout batch whenever the server is more than `max_policy_lag` versions behind (with a lag of 1
or more, rollouts are read ahead and the weights pushed after every step), then checks a few of
the server's logprobs against its own. `enabled: auto` syncs when the head lists such a server
and is an error when it does not, unless `off_policy: true` (importance sampling then on). With
LoRA the policy server gets the adapter merged into the base weights (trainer/lora.py).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import httpx

from .client import default_head_url, run_sync
from .config import TrainConfig, TrainConfigError, grpo_args, model_path
from .data import load_rows
from .environment_factory import environment_inputs, tool_chat_template
from .grpo import trainer_class
from .jsonl import JsonlAppender, read_complete_lines
from .lora import peft_config
from .report import write_training_report
from .step_log import StepLog, plot
from .trl import make_rollout_func, reward_functions, to_trl_dataset
from .weight_sync import PolicyHooks, WeightSync, WeightSyncError, find_policy_server

log = logging.getLogger("gymserve.trainer")
ROLLOUTS = "rollouts.jsonl"


def _reward_funcs(config: TrainConfig, args: Any) -> list[Any]:
    mode = config.reward_functions
    comps = config.reward_components
    if config.grpo.advantage == "gdpo":
        if mode in ("total", "both"):
            raise TrainConfigError("grpo.advantage gdpo normalizes each reward component: "
                                   "reward_functions must be auto or components")
        mode = "components"
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
    """The policy server's weight sync, or None (vLLM via TRL, disabled, or `off_policy` on purpose).

    With `enabled: auto` a policy server whose weights cannot be updated is an error naming the
    fix: training would silently go off-policy after the first step. `off_policy: true` allows it
    and turns the importance-sampling correction on (config.importance_sampling)."""
    options = config.weight_sync
    enabled = options.enabled
    if enabled is False:
        return None
    if getattr(args, "use_vllm", False):
        log.info("use_vllm: TRL keeps vLLM's weights in sync; gymserve's weight sync is off")
        return None
    try:
        name, url = find_policy_server(head_url, options.policy_server)
    except (WeightSyncError, httpx.HTTPError, ValueError) as exc:
        if options.off_policy and enabled == "auto":
            log.warning("NO WEIGHT SYNC (weight_sync.off_policy: true; %s): rollouts become off-policy after the "
                        "first step; importance-sampling correction is on", exc)
            return None
        raise TrainConfigError(
            f"weight_sync: {exc}. Without weight sync the policy server keeps its initial weights and training "
            "goes off-policy after the first step: serve the policy with models/vllm or models/hf "
            "(accept_weights=true), or set weight_sync.off_policy=true to train off-policy on purpose "
            "(importance-sampling correction on)") from None
    log.info("weight sync: policy server %s at %s, max_policy_lag=%d", name, url, options.max_policy_lag)
    return WeightSync(url, max_policy_lag=options.max_policy_lag, required=not options.off_policy,
                      push_every_step=options.max_policy_lag >= 1, check_tolerance=options.check_tolerance)


def build_trainer(config: TrainConfig):
    """The GRPOTrainer for `config` (model loaded, datasets indexed, rollout func wired)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = grpo_args(config)
    if os.environ.get("GYMSERVE_TORCH_THREADS"):  # the same knob as the model servers' (busy small machines)
        import torch

        torch.set_num_threads(int(os.environ["GYMSERVE_TORCH_THREADS"]))
    train_rows, eval_rows = load_rows(config)
    path = model_path(config.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")
    rollout = config.rollout.model_dump(exclude_unset=True)
    head_url = config.head_url or default_head_url()
    hooks = PolicyHooks(weight_sync(config, args, head_url) if config.mode == "rollout_func" else None)
    rollouts = JsonlAppender(Path(config.output_dir) / ROLLOUTS, truncate=True)  # every record, as sampled

    def keep(records: list[dict[str, Any]]) -> None:
        for record in records:
            rollouts.write(record)

    step_log = StepLog(config.output_dir, total=args.max_steps if args.max_steps > 0 else None,
                       progress=config.progress, head_url=head_url)
    common = {"model": model, "args": args, "processing_class": tokenizer, "callbacks": [step_callback(step_log)],
              "advantage": config.grpo.advantage, "peft_config": peft_config(config.lora, model)}
    if config.mode == "environment_factory":  # TRL generates with the model it trains: no rollouts, no sync
        rollout_func = None
        common["processing_class"] = tool_chat_template(tokenizer)
        trainer = trainer_class()(**common, **environment_inputs(config, head_url, train_rows, eval_rows))
    else:
        rollout_func = make_rollout_func(head_url, tokenizer, rows=train_rows + eval_rows,
                                         before_batch=hooks.before_batch, after_batch=hooks.after_batch,
                                         on_records=keep, max_policy_lag=config.weight_sync.max_policy_lag,
                                         is_stale=hooks.is_stale, on_stats=hooks.on_stats, **rollout)
        trainer = trainer_class()(**common, reward_funcs=_reward_funcs(config, args),
                                  train_dataset=to_trl_dataset(train_rows),
                                  eval_dataset=to_trl_dataset(eval_rows) if eval_rows else None,
                                  rollout_func=rollout_func, importance_sampling=config.importance_sampling(),
                                  importance_sampling_cap=config.grpo.truncated_importance_sampling_ratio)
    if config.progress:  # the rich bar replaces transformers' tqdm bar and its printed dicts
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
    trainer.gymserve_sync = hooks.sync
    trainer.gymserve_rollouts = rollouts
    trainer.gymserve_client = rollout_func.client if rollout_func else None  # type: ignore[attr-defined]
    return trainer


def train(config: TrainConfig) -> dict[str, Any]:
    trainer = build_trainer(config)
    try:
        result = trainer.train()
    finally:
        trainer.gymserve_rollouts.close()
        queue = getattr(getattr(trainer, "rollout_func", None), "queue", None)
        if queue is not None:  # rollouts read ahead past the last step
            queue.close()
        if trainer.gymserve_client is not None:
            run_sync(trainer.gymserve_client.aclose)  # its pooled connections, before the loop thread dies
    sync = trainer.gymserve_sync
    # the policy server ends on the final weights (a read-ahead or a last evaluation may have pushed them)
    if sync is not None and (sync.server_version is None or sync.server_version < int(result.global_step)):
        sync.push(trainer.accelerator.unwrap_model(trainer.model), int(result.global_step))
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
