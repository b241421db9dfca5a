"""GRPOTrainer with our advantage estimators, mismatch metrics and importance-sampling correction.

After TRL has scored a rollout batch (`_generate_and_score_completions`):

1. **Advantages**: with `grpo.advantage` other than `trl`, TRL's group mean/std advantages
   are replaced by `trainer.advantages.compute_advantages` on the same rewards (the weighted
   total, or the reward components for `gdpo`), groups of `num_generations` samples.
2. **Mismatch metrics**: the trainer's logprobs of the sampled tokens (one extra no-grad
   forward pass unless TRL computed them) are compared with the logprobs our policy server
   reported when it sampled them (trainer/metrics.py): NeMo RL's five metrics plus
   `policy/logp_delta_mean|max`, logged every step; a warning when one deviates by > 1e-3.
3. **Truncated importance sampling** (`use_importance_sampling_correction`, on by default
   when `max_policy_lag > 0`): each token's advantage is multiplied by
   min(exp(trainer - sampler), `truncated_importance_sampling_ratio`). The weight is
   positive and detached, so weighting the advantage equals weighting the clipped
   per-token loss, which is how NeMo RL applies it; TRL takes per-token advantages (B, T).
   TRL's own vLLM correction (`vllm_importance_sampling_correction`) is left alone.
4. **Per-environment reward**: `reward/<agent name>` is the mean total reward of the
   batch's samples routed to that agent, so a blended run shows one curve per environment.

Both sides must use the same temperature for the metrics to mean anything: models/hf
reports the raw model's logprobs, TRL scales logits by `temperature`, so keep
`temperature: 1.0` (the deploy/train configs do).
"""
from __future__ import annotations

import json
import logging
import math
from typing import Any

from .advantages import compute_advantages
from .client import agent_name
from .metrics import exceeding, importance_weights, mismatch_metrics
from .rollout_queue import Lookahead
from .step_log import ENV_REWARD_PREFIX, LOGP_DELTA_MAX, LOGP_DELTA_MEAN
from .trl import ROW_COLUMN

log = logging.getLogger("gymserve.trainer.grpo")


def logp_delta(trainer_logps: Any, sampling_logps: Any, mask: Any) -> tuple[float, float] | None:
    """(mean, max) of |trainer - sampler| over masked tokens whose sampling logprob is known."""
    import torch

    delta = (trainer_logps.float() - sampling_logps.float()).abs()
    keep = mask.bool() & ~torch.isnan(delta)
    values = delta[keep]
    if values.numel() == 0:
        return None
    return float(values.mean()), float(values.max())


def trainer_class() -> type:
    """GymGRPOTrainer (built lazily: importing trl is slow)."""
    from trl import GRPOTrainer

    class GymGRPOTrainer(GRPOTrainer):
        def __init__(self, *args: Any, advantage: str = "trl", importance_sampling: bool = False,
                     importance_sampling_cap: float | None = 2.0, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.gymserve_advantage = advantage
            self.gymserve_importance_sampling = importance_sampling
            self.gymserve_is_cap = importance_sampling_cap
            self._gymserve_rewards: Any = None
            if importance_sampling and not self.use_vllm:
                log.info("truncated importance-sampling correction on (cap %s)", importance_sampling_cap)

        def get_train_dataloader(self) -> Any:
            """Read ahead for asynchronous rollouts (trainer/rollout_queue.py) when the rollout function queues."""
            loader = super().get_train_dataloader()
            depth = getattr(self.rollout_func, "read_ahead", 0)
            if not depth:
                return loader
            return Lookahead(loader, lambda batch: self.rollout_func.prefetch(batch, self), depth)

        def _calculate_rewards(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            rewards = super()._calculate_rewards(inputs, *args, **kwargs)
            self._gymserve_rewards = rewards  # (all processes' samples, reward functions)
            return rewards

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            output = super()._generate_and_score_completions(inputs)
            mode = "train" if self.model.training else "eval"
            rewards = self._gymserve_rewards
            if rewards is not None:
                self._log_env_rewards(inputs, rewards, mode)
                if self.gymserve_advantage != "trl":
                    output["advantages"] = self._advantages(rewards, len(inputs), mode).to(output["advantages"])
            try:
                self._sampler_correction(output, mode)
            except Exception:  # a metric must never stop training; the correction is then skipped
                log.exception("cannot compare the sampler's and the trainer's logprobs")
            return output

        def _total(self, rewards: Any) -> Any:
            import torch

            total = (rewards * self.reward_weights.to(rewards.device).unsqueeze(0)).nansum(dim=1)
            total[torch.isnan(rewards).all(dim=1)] = torch.nan  # unscorable: no reward, not 0
            return total

        def _advantages(self, rewards: Any, local: int, mode: str) -> Any:
            import numpy as np
            import torch

            generations = self.num_generations if mode == "train" else self.num_generations_eval
            groups = np.arange(rewards.size(0)) // max(1, generations)
            components = weights = None
            if self.gymserve_advantage == "gdpo":  # one column per reward component (the total left out)
                names = self.reward_func_names
                components = {n: rewards[:, i].double().cpu().numpy() for i, n in enumerate(names) if n != "env_reward"}
                weights = {n: float(w) for n, w in zip(names, self.reward_weights.tolist()) if n in components}
            values = compute_advantages(self.gymserve_advantage, self._total(rewards).double().cpu().numpy(), groups,
                                        components=components, weights=weights)
            start = self.accelerator.process_index * local
            return torch.tensor(values[start:start + local], dtype=torch.float32)

        def _log_env_rewards(self, inputs: Any, rewards: Any, mode: str) -> None:
            local = len(inputs)
            start = self.accelerator.process_index * local
            total = self._total(rewards)[start:start + local]
            per_env: dict[str, list[float]] = {}
            for item, value in zip(inputs, total.tolist()):
                try:
                    name = agent_name(json.loads(item.get(ROW_COLUMN) or "{}")) or "unknown"
                except (TypeError, ValueError):
                    name = "unknown"
                if not math.isnan(value):
                    per_env.setdefault(name, []).append(value)
            for name, values in per_env.items():
                self._metrics[mode][f"{ENV_REWARD_PREFIX}{name}"].append(sum(values) / len(values))

        def _sampler_correction(self, output: dict[str, Any], mode: str) -> None:
            import torch

            sampling = output.get("sampling_per_token_logps")
            if sampling is None:
                return
            mask = output["completion_mask"]
            if output.get("tool_mask") is not None:
                mask = mask * output["tool_mask"]
            ours = output.get("old_per_token_logps")
            if ours is None:
                completion = output["completion_ids"]
                ids = torch.cat([output["prompt_ids"], completion], dim=1)
                attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
                size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
                with torch.no_grad():
                    ours, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, attention,
                                                                         completion.size(1), batch_size=size)
            use_is = self.gymserve_importance_sampling and not self.use_vllm
            metrics = mismatch_metrics(ours, sampling, mask, cap=self.gymserve_is_cap if use_is else None)
            for key, value in metrics.items():
                self._metrics[mode][key].append(value)
            stats = logp_delta(ours, sampling, mask)
            if stats is not None:
                self._metrics[mode][LOGP_DELTA_MEAN].append(stats[0])
                self._metrics[mode][LOGP_DELTA_MAX].append(stats[1])
            high = exceeding(metrics)
            if high:
                log.warning("sampler/trainer mismatch above 1e-3 at step %d: %s", self.state.global_step,
                            ", ".join(f"{k}={v:.4g}" for k, v in sorted(high.items())))
            if use_is:
                weights = importance_weights(ours, sampling, mask, self.gymserve_is_cap).to(output["advantages"])
                advantages = output["advantages"]
                if advantages.dim() == 1:
                    advantages = advantages.unsqueeze(1)
                output["advantages"] = advantages * weights.detach()

    return GymGRPOTrainer
