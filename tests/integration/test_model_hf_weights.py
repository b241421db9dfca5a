"""Weight sync against a real models/hf server: the trainer's WeightSync pushes a safetensors file,
the server reports the new `weights_version` in /v1/models and /stats, samples with the new
weights (its logprobs match a local forward pass of them) and stamps `policy_version` on replies."""
from __future__ import annotations

import httpx
import pytest
import torch

from gymserve.testing import ServerProcess
from services.models.hf.tiny import make_tiny_model
from tests.integration._trainer_stack import small_stack
from trainer.weight_sync import WeightSync, find_policy_server


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3)


@pytest.fixture(scope="module")
def server(tiny_folder):
    with ServerProcess("models/hf", f"model={tiny_folder}", "max_batch_size=4", "max_model_len=512",
                       "default_max_tokens=8", "torch_threads=1", "accept_weights=true") as proc:
        yield proc


def _version(url: str) -> tuple[int, int]:
    models = httpx.get(f"{url}/v1/models", timeout=30).json()
    stats = httpx.get(f"{url}/stats", timeout=30).json()
    return models["data"][0]["weights_version"], stats["weights_version"]


def _respond(url: str) -> dict:
    body = {"input": [{"role": "user", "content": "hello"}], "temperature": 1.0, "seed": 5, "max_output_tokens": 6}
    reply = httpx.post(f"{url}/v1/responses", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()["output"][-1]


def _local_logprobs(model, prompt_ids: list[int], gen_ids: list[int]) -> list[float]:
    ids = torch.tensor([prompt_ids + gen_ids])
    with torch.no_grad():
        logps = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    start = len(prompt_ids)
    return [float(logps[start - 1 + i, t]) for i, t in enumerate(gen_ids)]


def test_push_changes_the_sampling_policy_and_versions(server, tiny_folder) -> None:
    from transformers import AutoModelForCausalLM

    assert _version(server.url) == (0, 0)
    assert _respond(server.url)["policy_version"] == 0
    model = AutoModelForCausalLM.from_pretrained(str(tiny_folder)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    sync = WeightSync(server.url, max_policy_lag=1)
    assert sync.before_rollout(model, 0).synced  # the first batch always syncs
    assert sync.server_version == 0 and sync.offset == 1  # versions only move forward: step 0 is version 1
    assert _version(server.url) == (1, 1)
    assert not sync.before_rollout(model, 1).synced  # lag 1 is allowed
    result = sync.before_rollout(model, 2)  # lag 2 is not
    assert result.synced and result.version == 2
    assert _version(server.url) == (3, 3)
    item = _respond(server.url)
    assert item["policy_version"] == 3
    ours = _local_logprobs(model, item["prompt_token_ids"], item["generation_token_ids"])
    assert max(abs(a - b) for a, b in zip(ours, item["generation_log_probs"])) < 1e-3


@pytest.mark.parametrize("body, field", [
    ({"version": 1}, "path"),
    ({"path": "/nonexistent/w.safetensors"}, "version"),
    ({"path": "/nonexistent/w.safetensors", "version": 1}, "path"),
    ({"path": "/etc/hostname", "version": 1}, "path"),
    ({"path": "x.safetensors", "version": -1}, "version"),
])
def test_bad_weight_updates_are_400_naming_the_field(server, body, field) -> None:
    reply = httpx.post(f"{server.url}/v1/weights", json=body, timeout=30)
    assert reply.status_code == 400, reply.text
    assert field in reply.text


def test_wrong_tensors_are_refused_and_the_version_stays(server, tmp_path) -> None:
    from services.models.hf.weights import save_tensors

    before = _version(server.url)
    path = tmp_path / "w.safetensors"
    save_tensors({"lm_head.weight": torch.zeros(3, 3)}, path)
    reply = httpx.post(f"{server.url}/v1/weights", json={"path": str(path), "version": 99}, timeout=30)
    assert reply.status_code == 400 and "shape" in reply.text
    assert _version(server.url) == before


def test_trainer_finds_the_policy_server_on_the_head(tiny_folder) -> None:
    servers = [("models/hf", "policy_model", [f"model={tiny_folder}", "torch_threads=1"])]
    with small_stack(servers) as (head, started):
        name, url = find_policy_server(head.url)
        assert (name, url) == ("policy_model", started["policy_model"].url)
        assert find_policy_server(head.url, "policy_model")[1] == url
        with pytest.raises(RuntimeError, match="no server named"):
            find_policy_server(head.url, "nope")
