"""NeMo RL adapter: an EnvironmentInterface-compatible Ray actor backed by a gymserve
resource server's `/verify/batch`.

    from nemo_rl.environments.utils import register_env
    register_env("gymserve_math", "trainer.adapters.nemo_rl.GymserveEnvironment")
    # env config: {"verify_url": "http://host:port"}  or  {"head_url": ..., "resource_server": "math"}
    #             optional "reward_components": ["correct", "format"], "timeout_s", "pass_threshold"

`step(message_logs, env_infos)`: the assistant turns of each message log are the response,
the other messages the prompt, and `env_infos[i]` the row's task fields (expected_answer, ...).
It returns NeMo RL's EnvironmentReturn fields. With `reward_components` configured, rewards have
shape (batch, components) in that order (multi-reward / GDPO); otherwise (batch,).
NeMo RL has no per-sample mask in EnvironmentReturn: a masked verify gets reward 0 with
`metadata[i]["mask_sample"] = True`, and `global_post_process_and_metrics` zeroes the
sample's `loss_multiplier` when the batch carries those metadata, so it does not train.
nemo_rl itself is not imported: the NamedTuple below has the same fields, in the same order.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from services.core.auth import trust
from services.core.content import content_text
from services.core.directory import Directory

from ..client import run_sync


class EnvironmentReturn(NamedTuple):
    """Field-for-field NeMo RL's `nemo_rl.environments.interfaces.EnvironmentReturn`."""

    observations: list[dict[str, str]]
    metadata: list[Any]
    next_stop_strings: list[list[str] | None] | list[None]
    rewards: Any  # torch.Tensor (batch,) or (batch, components)
    terminateds: Any  # torch.Tensor (batch,)
    answers: list[str | None] | None


def _content(message: dict[str, Any]) -> str:
    return content_text(message.get("content"))


def verify_body(message_log: list[dict[str, Any]], info: dict[str, Any] | None) -> dict[str, Any]:
    """A `/verify` body: assistant turns -> the response text, the rest -> the prompt."""
    response_text = "".join(_content(m) for m in message_log if m.get("role") == "assistant")
    prompt = [{"role": m.get("role", "user"), "content": _content(m)} for m in message_log
              if m.get("role") != "assistant"]
    fields = {k: v for k, v in (info or {}).items() if k not in ("response", "responses_create_params")}
    return {"responses_create_params": {"input": prompt or [{"role": "user", "content": ""}]},
            "response": {"object": "response", "status": "completed", "output": [
                {"type": "message", "role": "assistant", "status": "completed",
                 "content": [{"type": "output_text", "text": response_text, "annotations": []}]}]},
            **fields}


class GymserveEnvironmentImpl:
    """The plain class (usable without Ray); `GymserveEnvironment` is its Ray actor."""

    def __init__(self, cfg: dict[str, Any] | None = None) -> None:
        cfg = dict(cfg or {})
        self.verify_url = cfg.get("verify_url")
        self.head_url = cfg.get("head_url")
        self.resource_server = cfg.get("resource_server")
        if not self.verify_url and not (self.head_url and self.resource_server):
            raise ValueError("gymserve NeMo RL env: set verify_url, or head_url and resource_server")
        self.reward_components: list[str] = list(cfg.get("reward_components") or [])
        self.timeout_s = float(cfg.get("timeout_s", 600.0))
        self.pass_threshold = float(cfg.get("pass_threshold", 1.0))
        self._directory = Directory(self.head_url, via_head="auto") if self.head_url else None

    async def _url(self) -> str:
        if self.verify_url:
            trust(str(self.verify_url))  # configured by the user: it gets the key
            return str(self.verify_url).rstrip("/")
        assert self._directory is not None
        return await self._directory.url(self.resource_server)

    async def _verify(self, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from services.core.client import shared_client

        url = await self._url()
        replies = await shared_client().post_json(f"{url}/verify/batch", bodies, deadline_s=self.timeout_s)
        if not isinstance(replies, list) or len(replies) != len(bodies):
            raise RuntimeError(f"{url}/verify/batch returned an unexpected reply for {len(bodies)} items")
        return replies

    def step(self, message_log_batch: list[list[dict[str, Any]]], metadata: list[dict[str, Any] | None]
             ) -> EnvironmentReturn:
        import torch

        if len(message_log_batch) != len(metadata):
            raise ValueError(f"{len(message_log_batch)} message logs but {len(metadata)} env infos")
        bodies = [verify_body(log, info) for log, info in zip(message_log_batch, metadata)]
        replies = run_sync(lambda: self._verify(bodies)) if bodies else []
        observations, out_meta, answers, rows = [], [], [], []
        for info, body, reply in zip(metadata, bodies, replies):
            masked = bool(reply.get("mask_sample"))
            reward = 0.0 if masked else float(reply.get("reward", 0.0))
            comps = reply.get("reward_components") or {}
            if self.reward_components:
                rows.append([0.0 if masked else float(comps.get(name, 0.0)) for name in self.reward_components])
            else:
                rows.append(reward)
            if masked:
                text = f"Environment: verification failed ({reply.get('failure_kind')}): {reply.get('failure_reason')}"
            else:
                text = f"Environment: reward {reward:g}"
            observations.append({"role": "environment", "content": text})
            meta = dict(info or {})
            meta.update(mask_sample=masked, failure_kind=reply.get("failure_kind"),
                        failure_reason=reply.get("failure_reason"), reward=reward, reward_components=comps or None)
            out_meta.append(meta)
            answers.append(body["response"]["output"][0]["content"][0]["text"])
        n = len(bodies)
        return EnvironmentReturn(observations=observations, metadata=out_meta, next_stop_strings=[None] * n,
                                 rewards=torch.tensor(rows, dtype=torch.float32),
                                 terminateds=torch.ones(n, dtype=torch.bool), answers=answers)

    def global_post_process_and_metrics(self, batch: Any) -> tuple[Any, dict[str, Any]]:
        """Mask failed samples (loss_multiplier 0 when the batch has metadata) and report accuracy."""
        import torch

        metrics: dict[str, Any] = {}
        infos = _get(batch, "extra_env_info")
        masked = [bool(isinstance(i, dict) and i.get("mask_sample")) for i in infos] if infos is not None else None
        multiplier = _get(batch, "loss_multiplier")
        if masked is not None and multiplier is not None and any(masked):
            keep = torch.tensor([0.0 if m else 1.0 for m in masked], dtype=multiplier.dtype, device=multiplier.device)
            batch["loss_multiplier"] = multiplier * keep
        rewards = _get(batch, "total_reward")
        if rewards is None:
            rewards = _get(batch, "rewards")
        if rewards is not None:
            r = torch.as_tensor(rewards, dtype=torch.float32)
            if r.ndim > 1:
                r = r.sum(dim=-1)
            valid = (torch.tensor([not m for m in masked], dtype=torch.bool) if masked is not None
                     else torch.ones_like(r, dtype=torch.bool))
            scored = r[valid] if valid.numel() == r.numel() else r
            metrics["accuracy"] = float((scored >= self.pass_threshold).float().mean()) if scored.numel() else 0.0
            metrics["mean_reward"] = float(scored.mean()) if scored.numel() else 0.0
        if masked is not None:
            metrics["num_masked"] = int(sum(masked))
            metrics["fraction_masked"] = float(sum(masked) / len(masked)) if masked else 0.0
        return batch, metrics

    def shutdown(self) -> None:
        pass


def _get(batch: Any, key: str) -> Any:
    try:
        return batch[key] if key in batch else None
    except TypeError:
        return getattr(batch, key, None)


try:  # the Ray actor NeMo RL instantiates (`.options(...).remote(cfg)`)
    import ray

    GymserveEnvironment = ray.remote(max_restarts=-1, max_task_retries=-1)(GymserveEnvironmentImpl)
except ImportError:  # pragma: no cover - Ray is optional
    GymserveEnvironment = None  # type: ignore[assignment]
