"""verl agent loop whose trajectories run on gymserve agents (`agent_name: gymserve_agent`).

verl (0.9.x, `verl.experimental.agent_loop`) builds every sample in an agent loop chosen by the
dataset's `agent_name` column; this one sends the sample's gymserve row to its agent through the
head (`$GYMSERVE_HEAD_URL`) and hands verl the agent's trajectory: prompt and response token ids,
the response mask (1 for model tokens, 0 for tool output and template tokens between calls), the
sampler's logprobs and the reward the environment gave, so verl needs no reward function.

    # verl config (gymserve on PYTHONPATH), and rows whose agent_name is gymserve_agent
    actor_rollout_ref.rollout.agent.agent_loop_config_path: <a yaml listing>
      - name: gymserve_agent
        _target_: trainer.adapters.verl_agent_loop.GymserveAgentLoop

The row is the dataset's `extra_info.gym_row` (a gymserve / NeMo-Gym row with `agent_ref`).
Its policy is the model server the agent calls: in a verl run, point the stack's `policy_model`
(`models/openai_proxy`) at verl's rollout server so the tokens come from the policy verl trains.
verl has no per-sample mask: a masked rollout raises `VerifyFailed` (the step fails) unless
`GYMSERVE_VERL_ON_FAILURE=zero`, which returns reward 0.0 with `mask_sample: 1` in `extra_fields`
and a response mask of zeros (no token of it is trained); a row the agent rejects (bad_request)
raises either way.
"""
from __future__ import annotations

import os
import time
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from ..client import RolloutClient, is_failure
from ..tokens import StitchError, stitch
from .verl import VerifyFailed

AGENT_NAME = "gymserve_agent"


_clients: dict[str | None, RolloutClient] = {}


def rollout_client(head_url: str | None) -> RolloutClient:
    """One client per head for the process: verl builds a loop per sample, and every sample reuses this
    client's connections and its directory of the head's servers (no per-sample set-up)."""
    if head_url not in _clients:
        _clients[head_url] = RolloutClient(head_url, concurrency=1024)
    return _clients[head_url]


def sampling_fields(sampling_params: dict[str, Any], response_length: int | None) -> dict[str, Any]:
    """verl's sampling params as Responses API fields."""
    fields = {key: sampling_params[key] for key in ("temperature", "top_p") if sampling_params.get(key) is not None}
    if response_length:
        fields["max_output_tokens"] = int(response_length)
    return fields


@register(AGENT_NAME)
class GymserveAgentLoop(AgentLoopBase):
    """One verl sample = one rollout on the gymserve agent its row names."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.response_length = self.rollout_config.get("response_length")

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        row = dict((kwargs.get("extra_info") or {}).get("gym_row") or {})
        if not row.get("agent_ref"):
            raise ValueError("extra_info.gym_row: a gymserve row with agent_ref is required for gymserve_agent")
        row["responses_create_params"] = {**row.get("responses_create_params", {}),
                                          **sampling_fields(sampling_params, self.response_length)}
        started = time.monotonic()
        record = await rollout_client(os.environ.get("GYMSERVE_HEAD_URL")).run(row)
        elapsed = time.monotonic() - started
        if is_failure(record) or record.get("mask_sample"):
            return self._masked(row, record, elapsed)
        try:
            tokens = stitch(record["response"])
        except StitchError as exc:
            raise VerifyFailed(f"{row['agent_ref'].get('name')}: {exc}") from None
        limit = self.response_length or len(tokens.completion_ids)
        extra = {"policy_version": record.get("policy_version"), "reward_components": record.get("reward_components")}
        return AgentLoopOutput(prompt_ids=tokens.prompt_ids, response_ids=tokens.completion_ids[:limit],
                               response_mask=tokens.env_mask[:limit], response_logprobs=tokens.logprobs[:limit],
                               reward_score=float(record["reward"]), num_turns=2 * tokens.num_calls,
                               metrics=AgentLoopMetrics(generate_sequences=elapsed),
                               extra_fields={k: v for k, v in extra.items() if v is not None})

    def _masked(self, row: dict[str, Any], record: dict[str, Any], elapsed: float) -> AgentLoopOutput:
        reason = f"{record.get('failure_kind')}: {record.get('failure_reason')}"
        # a row the agent or environment rejects is the dataset's fault: never a 0, whatever the policy
        if os.environ.get("GYMSERVE_VERL_ON_FAILURE", "raise") != "zero" or record.get("failure_kind") == "bad_request":
            raise VerifyFailed(f"{row['agent_ref'].get('name')}: rollout failed ({reason})")
        messages = row["responses_create_params"].get("input") or []
        prompt = messages if isinstance(messages, list) else [{"role": "user", "content": str(messages)}]
        prompt_ids = list(self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                             return_dict=True)["input_ids"])
        eos = self.tokenizer.eos_token_id if self.tokenizer.eos_token_id is not None else 0
        return AgentLoopOutput(prompt_ids=prompt_ids, response_ids=[eos], response_mask=[0], response_logprobs=[0.0],
                               reward_score=0.0, num_turns=1, metrics=AgentLoopMetrics(generate_sequences=elapsed),
                               extra_fields={"mask_sample": 1, "failure_reason": reason})
