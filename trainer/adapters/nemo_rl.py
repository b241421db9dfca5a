"""NeMo RL adapter: an EnvironmentInterface Ray actor backed by a gymserve resource server's `/verify/batch`.

Registration, in the script that starts NeMo RL's GRPO (before `create_env` runs)::

    from trainer.adapters.nemo_rl import register
    register("gymserve_math")   # register_env(...) + ACTOR_ENVIRONMENT_REGISTRY[FQN] = PY_EXECUTABLES.SYSTEM

env config: `{"verify_url": "http://host:port"}` or `{"head_url": ..., "resource_server": "math"}`;
optional `reward_components`, `reward_format` (auto | dict | tensor), `on_failure` (raise | count),
`timeout_s`, `pass_threshold`.

NeMo RL's generic environment path has no per-sample mask: `run_multi_turn_rollout` keeps only the
`metadata` of samples that continue, and nothing calls `global_post_process_and_metrics` during
training. So a masked verify (infrastructure failure) cannot be dropped from the loss here. With
`on_failure: raise` (default) `step` raises `VerifyFailed` and the step fails loudly; with
`on_failure: count` the sample gets reward 0, every such 0 is logged as a warning and counted
(`fabricated_zeros`), never silently.
"""
from __future__ import annotations

import logging
from typing import Any, NamedTuple

from services.core.auth import trust
from services.core.content import content_text
from services.core.directory import Directory

from ..client import run_sync

log = logging.getLogger("gymserve.nemo_rl")

ACTOR_FQN = "trainer.adapters.nemo_rl.GymserveEnvironment"
REWARD_PREFIX = "reward/"  # NeMo RL main reads multi-reward batch keys starting with it (algorithms/utils.py)


class VerifyFailed(RuntimeError):
    """The environment could not judge at least one sample (masked) and NeMo RL cannot drop it."""


class _EnvironmentReturn(NamedTuple):
    """Field-for-field `nemo_rl.environments.interfaces.EnvironmentReturn` (used when nemo_rl is absent)."""

    observations: list[dict[str, str]]
    metadata: list[Any]
    next_stop_strings: list[list[str] | None] | list[None]
    rewards: Any  # Tensor (B,), (B, K) on v0.6/v0.7, or {"reward/<name>": Tensor (B,)} on main
    terminateds: Any  # Tensor (B,)
    answers: list[str | None] | None


def environment_return_class() -> type:
    """NeMo RL's own EnvironmentReturn when installed, else the identical local NamedTuple."""
    try:
        from nemo_rl.environments.interfaces import EnvironmentReturn
    except ImportError:
        return _EnvironmentReturn
    return EnvironmentReturn  # type: ignore[no-any-return]


def detect_reward_format() -> str:
    """`dict` when the installed NeMo RL's EnvironmentReturn.rewards admits a dict (main after v0.7.0),
    `tensor` for v0.6/v0.7 (`rewards: Tensor`, multi-reward as shape (B, K)); `dict` without NeMo RL."""
    cls = environment_return_class()
    if cls is _EnvironmentReturn:
        return "dict"
    annotation = getattr(cls, "__annotations__", {}).get("rewards")
    return "dict" if "dict" in str(annotation) else "tensor"


def register(env_name: str) -> None:
    """The two registrations NeMo RL's `create_env` needs: the env name, and a Python executable for
    the actor class (`get_actor_python_env` raises ValueError for an unlisted class)."""
    from nemo_rl.distributed.ray_actor_environment_registry import ACTOR_ENVIRONMENT_REGISTRY
    from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES
    from nemo_rl.environments.utils import register_env

    register_env(env_name, ACTOR_FQN)
    ACTOR_ENVIRONMENT_REGISTRY[ACTOR_FQN] = PY_EXECUTABLES.SYSTEM


def _content(message: dict[str, Any]) -> str:
    return content_text(message.get("content"))


def verify_body(message_log: list[dict[str, Any]], info: dict[str, Any] | None) -> dict[str, Any]:
    """A `/verify` body: assistant turns -> the response text, the rest -> the prompt. NeMo RL's
    `ground_truth` becomes `expected_answer` unless the row has one."""
    response_text = "".join(_content(m) for m in message_log if m.get("role") == "assistant")
    prompt = [{"role": m.get("role", "user"), "content": _content(m)} for m in message_log
              if m.get("role") != "assistant"]
    fields = {k: v for k, v in (info or {}).items() if k not in ("response", "responses_create_params")}
    if "ground_truth" in fields and "expected_answer" not in fields:
        fields["expected_answer"] = fields["ground_truth"]
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
        self.reward_format = str(cfg.get("reward_format", "auto"))
        if self.reward_format == "auto":
            self.reward_format = detect_reward_format()
        if self.reward_format not in ("dict", "tensor"):
            raise ValueError(f"reward_format must be auto, dict or tensor, not {self.reward_format!r}")
        self.on_failure = str(cfg.get("on_failure", "raise"))
        if self.on_failure not in ("raise", "count"):
            raise ValueError(f"on_failure must be raise or count, not {self.on_failure!r}")
        self.timeout_s = float(cfg.get("timeout_s", 600.0))
        self.pass_threshold = float(cfg.get("pass_threshold", 1.0))
        self.fabricated_zeros = 0
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

    def step(self, message_log_batch: list[list[dict[str, Any]]], metadata: list[dict[str, Any] | None],
             return_extracted_answer: bool = False) -> Any:
        """NeMo RL's `step`; evaluation (`nemo_rl/evals/eval.py`) passes `return_extracted_answer=True`
        and reads `rewards.tolist()`, so evaluation always gets the (B,) total."""
        import torch

        if len(message_log_batch) != len(metadata):
            raise ValueError(f"{len(message_log_batch)} message logs but {len(metadata)} env infos")
        bodies = [verify_body(log_, info) for log_, info in zip(message_log_batch, metadata)]
        replies = run_sync(lambda: self._verify(bodies)) if bodies else []
        failed = [(i, r) for i, r in enumerate(replies) if r.get("mask_sample")]
        if failed and self.on_failure == "raise":
            detail = "; ".join(f"#{i} {r.get('failure_kind')}: {r.get('failure_reason')}" for i, r in failed[:5])
            raise VerifyFailed(f"{len(failed)} of {len(replies)} samples could not be verified and NeMo RL "
                               f"has no per-sample mask on this path ({detail}); set on_failure: count to "
                               "train them as logged reward 0")
        for i, r in failed:
            self.fabricated_zeros += 1
            log.warning("gymserve: sample %d scored 0 without a verdict (%s: %s); %d such zeros so far",
                        i, r.get("failure_kind"), r.get("failure_reason"), self.fabricated_zeros)
        observations, out_meta, answers, totals, rows = [], [], [], [], []
        for info, body, reply in zip(metadata, bodies, replies):
            masked = bool(reply.get("mask_sample"))
            reward = 0.0 if masked else float(reply.get("reward", 0.0))
            comps = reply.get("reward_components") or {}
            totals.append(reward)
            rows.append([0.0 if masked else float(comps.get(name, 0.0)) for name in self.reward_components])
            text = (f"Environment: verification failed ({reply.get('failure_kind')}): {reply.get('failure_reason')}"
                    if masked else f"Environment: reward {reward:g}")
            observations.append({"role": "environment", "content": text})
            meta = dict(info or {})
            meta.update(mask_sample=masked, failure_kind=reply.get("failure_kind"),
                        failure_reason=reply.get("failure_reason"), reward=reward, reward_components=comps or None)
            out_meta.append(meta)
            answers.append(body["response"]["output"][0]["content"][0]["text"])
        n = len(bodies)
        rewards: Any = torch.tensor(totals, dtype=torch.float32)
        if self.reward_components and not return_extracted_answer:
            table = torch.tensor(rows, dtype=torch.float32).reshape(n, len(self.reward_components))
            if self.reward_format == "dict":
                rewards = {f"{REWARD_PREFIX}{name}": table[:, k] for k, name in enumerate(self.reward_components)}
            else:
                rewards = table
        return environment_return_class()(
            observations=observations, metadata=out_meta, next_stop_strings=[None] * n, rewards=rewards,
            terminateds=torch.ones(n, dtype=torch.bool), answers=answers)

    def global_post_process_and_metrics(self, batch: Any) -> tuple[Any, dict[str, Any]]:
        """Accuracy and the count of zeros scored without a verdict (NeMo RL's training loop does not
        call this hook; evaluation code and users may)."""
        import torch

        metrics: dict[str, Any] = {"fabricated_zeros": self.fabricated_zeros}
        rewards = batch["total_reward"] if "total_reward" in batch else None
        if rewards is not None:
            r = torch.as_tensor(rewards, dtype=torch.float32)
            metrics["accuracy"] = float((r >= self.pass_threshold).float().mean()) if r.numel() else 0.0
            metrics["mean_reward"] = float(r.mean()) if r.numel() else 0.0
        return batch, metrics

    def shutdown(self) -> None:
        pass


try:  # the Ray actor NeMo RL's create_env instantiates (`.options(runtime_env=...).remote(cfg)`)
    import ray

    GymserveEnvironment = ray.remote(max_restarts=-1, max_task_retries=-1)(GymserveEnvironmentImpl)
except ImportError:  # pragma: no cover - Ray is optional
    GymserveEnvironment = None  # type: ignore[assignment]
