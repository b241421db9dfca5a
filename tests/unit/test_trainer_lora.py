"""LoRA: the merged weights weight sync sends equal peft's `merge_and_unload()`, under the base
model's names (all of them on the first push, then only the wrapped layers), and a bad `lora`
config is an error naming the key."""
from __future__ import annotations

import copy
from pathlib import Path

import httpx
import pytest

from trainer.config import LoraConfig, TrainConfigError, load_config
from trainer.lora import is_peft, peft_config, policy_tensors
from trainer.weight_sync import WeightSync

TARGETS = ["q_proj", "v_proj"]


def _tiny_llama():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                        tie_word_embeddings=True))


def _peft_model(**lora):
    """A tiny Llama wrapped with LoRA whose B matrices are random (peft starts them at 0: no delta)."""
    import torch
    from peft import get_peft_model

    model = get_peft_model(_tiny_llama(), peft_config(LoraConfig(enabled=True, **lora), _tiny_llama()))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    return model


def test_merged_tensors_equal_merge_and_unload():
    import torch

    from services.models.hf.weights import check_tensors

    model = _peft_model(r=4, alpha=8, target_modules=TARGETS)
    plain = copy.deepcopy(model).merge_and_unload()
    expected = plain.state_dict()
    full = policy_tensors(model, full=True)
    assert set(full) == set(expected)  # the base model's names, no base_model.model..., no lora_A/lora_B
    for name, value in expected.items():
        assert torch.allclose(full[name], value, atol=1e-6, rtol=0), name
    changed = policy_tensors(model, full=False)
    assert sorted(changed) == sorted(f"model.layers.{i}.self_attn.{m}.weight" for i in range(2) for m in TARGETS)
    for name, value in changed.items():
        assert torch.allclose(value, expected[name], atol=1e-6, rtol=0), name
        base = model.get_base_model().get_submodule(name.removesuffix(".weight")).get_base_layer().weight
        assert not torch.allclose(value, base)  # the delta is really in there
    check_tensors(_tiny_llama(), full)  # what a models/hf server checks before it copies them in
    check_tensors(_tiny_llama(), changed)
    # the adapter itself is left as it was: nothing merged into the trained model
    assert is_peft(model) and not any(m.merged for m in model.modules() if hasattr(m, "merged"))


def test_a_plain_model_is_sent_as_its_state_dict():
    model = _tiny_llama()
    assert not is_peft(model)
    assert policy_tensors(model, full=False).keys() == model.state_dict().keys()


def test_weight_sync_sends_everything_first_then_only_the_adapted_layers(monkeypatch, tmp_path):
    """The policy server is faked here (its reply only); tests/integration/test_trainer_lora.py uses a real one."""
    from safetensors.torch import load_file

    sent: list[set[str]] = []

    def post(url, json, **_):
        sent.append(set(load_file(json["path"])))
        return httpx.Response(200, json={"weights_version": json["version"]})

    monkeypatch.setattr("trainer.weight_sync.httpx.post", post)
    monkeypatch.setattr(WeightSync, "weights_version", lambda self: 0)
    model = _peft_model(target_modules=TARGETS)
    sync = WeightSync("http://127.0.0.1:9", directory=tmp_path)
    assert sync.before_rollout(model, 0).synced and sync.before_rollout(model, 1).synced
    assert sent[0] == set(_tiny_llama().state_dict())
    assert sent[1] == {f"model.layers.{i}.self_attn.{m}.weight" for i in range(2) for m in TARGETS}
    assert not list(tmp_path.iterdir())  # the files are gone once the server answered


def _config(tmp_path: Path, overrides: list[str]):
    path = tmp_path / "c.yaml"
    path.write_text("output_dir: out\ntrain_data: data.jsonl\nlora: {enabled: true}\n")
    return load_config(path, overrides)


def test_lora_is_off_by_default_and_maps_to_peft(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("output_dir: out\ntrain_data: data.jsonl\n")
    assert not load_config(path).lora.enabled and peft_config(load_config(path).lora, _tiny_llama()) is None
    config = _config(tmp_path, ["lora.r=4", "lora.alpha=16", "lora.dropout=0.1", "lora.target_modules=[q_proj]"])
    peft = peft_config(config.lora, _tiny_llama())
    assert (peft.r, peft.lora_alpha, peft.lora_dropout, set(peft.target_modules)) == (4, 16, 0.1, {"q_proj"})
    assert peft_config(_config(tmp_path, ["lora.target_modules=all-linear"]).lora, _tiny_llama()).target_modules \
        == "all-linear"


@pytest.mark.parametrize("override, key", [
    ("lora.r=0", "lora.r"),
    ("lora.alpha=0", "lora.alpha"),
    ("lora.alpha=1.5", "lora.alpha"),
    ("lora.dropout=1.0", "lora.dropout"),
    ("lora.target_modules=[]", "lora.target_modules"),
    ("lora.target_modules=everything", "lora.target_modules"),
    ("lora.rank=8", "lora.rank"),
    ("lora.enabled=maybe", "lora.enabled"),
])
def test_bad_lora_config_names_the_key(tmp_path, override, key):
    with pytest.raises(TrainConfigError, match=key.replace(".", r"\.")):
        _config(tmp_path, [override])


def test_target_modules_the_model_lacks_name_the_key(tmp_path):
    config = _config(tmp_path, ["lora.target_modules=[q_proj, qkv_proj]"])
    with pytest.raises(TrainConfigError, match=r"lora\.target_modules.*qkv_proj"):
        peft_config(config.lora, _tiny_llama())
