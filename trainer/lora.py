"""LoRA training (peft) and the merged weights the policy server gets.

With `lora.enabled` the trainer trains a LoRA adapter (TRL's `peft_config`) on a frozen base
model, while the models/hf policy server keeps serving a plain model. Weight sync therefore
sends each wrapped layer's merged weight, W + B@A * alpha/r (peft's `get_delta_weight`, as
`merge_and_unload` applies it), under the base model's parameter name: only those tensors can
change, so only they are sent, except on the first push, which sends every base tensor so
a policy server left over from an earlier run starts from the trainer's weights.
"""
from __future__ import annotations

from typing import Any

from .config import LoraConfig, TrainConfigError

# state_dict keys below these submodules belong to the adapter, never to the base model
_ADAPTER_PARTS = ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector",
                  "lora_dropout")


def peft_config(lora: LoraConfig, model: Any) -> Any:
    """The `peft.LoraConfig` for `lora`, or None when LoRA is off. Target modules the model does
    not have are a `TrainConfigError` naming `lora.target_modules` (before TRL wraps the model)."""
    if not lora.enabled:
        return None
    from peft import LoraConfig as PeftLoraConfig

    if isinstance(lora.target_modules, list):
        names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        missing = sorted(set(lora.target_modules) - names)
        if missing:
            linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ == "Linear"})
            raise TrainConfigError(f"lora.target_modules: the model has no module named {missing} "
                                   f"(its linear layers: {linear})")
    return PeftLoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                          target_modules=lora.target_modules, task_type="CAUSAL_LM")


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def merged_tensors(model: Any) -> dict[str, Any]:
    """{base parameter name: merged weight} for every layer the active adapters wrap."""
    import torch
    from peft.tuners.lora import LoraLayer

    merged: dict[str, Any] = {}
    with torch.no_grad():
        for name, module in model.get_base_model().named_modules():
            if not isinstance(module, LoraLayer):
                continue
            layer: Any = module  # Linear, Embedding, ...: each LoraLayer kind has its get_delta_weight
            weight = layer.get_base_layer().weight.detach()
            if not layer.merged:  # a merged layer already holds W + delta
                for adapter in layer.active_adapters:
                    if adapter in layer.lora_A or adapter in layer.lora_embedding_A:
                        weight = weight + layer.get_delta_weight(adapter).to(weight.dtype)
            merged[f"{name}.weight"] = weight
    return merged


def policy_tensors(model: Any, *, full: bool = True) -> dict[str, Any]:
    """The tensors a plain copy of the model needs, named like its `state_dict()`: the model's own
    state dict, or for a peft model the merged weights (all base tensors when `full`)."""
    if not is_peft(model):
        return dict(model.state_dict())
    merged = merged_tensors(model)
    if not full:
        return merged
    tensors: dict[str, Any] = {}
    for key, value in model.get_base_model().state_dict().items():
        parts = key.split(".")
        if any(part in _ADAPTER_PARTS for part in parts):
            continue
        tensors[".".join(p for p in parts if p != "base_layer")] = value
    tensors.update(merged)
    return tensors
