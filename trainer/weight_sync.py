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

POLICY_KIND = "models/hf"


class WeightSyncError(RuntimeError):
    pass


@dataclass
class SyncResult:
    version: int
    synced: bool
    seconds: float = 0.0


def find_policy_server(head_url: str, name: str | None = None, timeout_s: float = 30.0) -> tuple[str, str]:
    """(name, url) of the policy server: the instance called `name`, else the only models/hf instance."""
    rows = httpx.get(f"{head_url.rstrip('/')}/server_instances", headers=auth_headers(), timeout=timeout_s).json()
    if name:
        for row in rows:
            if row.get("name") == name:
                return name, str(row["url"]).rstrip("/")
        raise WeightSyncError(f"weight_sync.policy_server: no server named {name!r} is registered with the head")
    policies = [row for row in rows if row.get("kind") == POLICY_KIND]
    if len(policies) != 1:
        found = ", ".join(r["name"] for r in policies) or "none"
        raise WeightSyncError(f"weight_sync: expected one {POLICY_KIND} server on the head, found {found}; "
                              "name it with weight_sync.policy_server")
    return str(policies[0]["name"]), str(policies[0]["url"]).rstrip("/")


class WeightSync:
    """Pushes the trainer's weights to one models/hf server when its version lags too far."""

    def __init__(self, url: str, *, max_policy_lag: int = 0, directory: str | Path | None = None,
                 timeout_s: float = 300.0, required: bool = True, push_every_step: bool = False) -> None:
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
        self.required = required  # False (enabled: auto): a server with weight updates off only warns
        self.disabled = False

    def weights_version(self) -> int:
        """The server's current `weights_version` (from `GET /v1/models`)."""
        body = httpx.get(f"{self.url}/v1/models", headers=auth_headers(), timeout=self.timeout_s).json()
        return int(body["data"][0]["weights_version"])

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
            log.warning("NO WEIGHT SYNC: the policy server has weight updates off (start it with "
                        "accept_weights=true); rollouts become off-policy after the first step")
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
        seconds = time.perf_counter() - started
        log.info("policy server now on weights version %d (%.2fs)", self.server_version, seconds)
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
