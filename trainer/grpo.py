"""GRPOTrainer plus the sampler/trainer mismatch metric.

After TRL has scored a rollout batch, the trainer's own logprobs of the sampled tokens are
compared with the logprobs the policy server reported when it sampled them:
`policy/logp_delta_mean` and `policy/logp_delta_max` (|Δlogp| over the tokens the model
generated). Right after a weight sync they differ only by float noise (batching, kernels);
a stale policy server shows up as a growing gap. TRL computes the trainer's logprobs itself
when it needs them (vLLM importance sampling, several iterations per batch); otherwise one
extra no-grad forward pass over the batch computes them here.

Both sides must use the same temperature for the numbers to be comparable: models/hf
reports the raw model's logprobs, TRL scales logits by `temperature`, so keep
`temperature: 1.0` when reading this metric (the learn_cpu run does).
"""
from __future__ import annotations

import logging
from typing import Any

from .step_log import LOGP_DELTA_MAX, LOGP_DELTA_MEAN

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
    """GRPOTrainer with the |Δlogp| metric (built lazily: importing trl is slow)."""
    from trl import GRPOTrainer

    class GymGRPOTrainer(GRPOTrainer):
        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            output = super()._generate_and_score_completions(inputs)
            try:
                self._log_logp_delta(output)
            except Exception:  # a metric must never stop training
                log.exception("cannot compute the sampler/trainer logprob mismatch")
            return output

        def _log_logp_delta(self, output: dict[str, Any]) -> None:
            import torch

            sampling = output.get("sampling_per_token_logps")
            if sampling is None:
                return
            mode = "train" if self.model.training else "eval"
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
            stats = logp_delta(ours, sampling, mask)
            if stats is not None:
                self._metrics[mode][LOGP_DELTA_MEAN].append(stats[0])
                self._metrics[mode][LOGP_DELTA_MAX].append(stats[1])

    return GymGRPOTrainer
