"""`POST /v1/weights` on models/hf: off unless the training stack turns it on (403 even with the key),
versions only move forward (409), and the tensors are a private copy, so a file truncated after
loading cannot crash the server (a lazily memory-mapped one dies of SIGBUS)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gymserve.testing import ServerProcess
from services.models.hf.tiny import make_tiny_model
from services.models.hf.weights import save_tensors

KEY = "weights-test-key-2e6b"
ENV = {"GYMSERVE_API_KEY": KEY, "GYMSERVE_HEAD_URL": ""}
REPO = Path(__file__).resolve().parents[2]
OPTIONS = ("max_batch_size=2", "max_model_len=256", "default_max_tokens=4", "torch_threads=1")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=5)


@pytest.fixture(scope="module")
def weights_file(tiny, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny))
    path = tmp_path_factory.mktemp("w") / "w.safetensors"
    save_tensors(model.state_dict(), path)
    return path


def test_weight_updates_are_off_by_default_even_with_the_key(tiny, weights_file):
    with ServerProcess("models/hf", f"model={tiny}", *OPTIONS, env=ENV) as server:
        r = server.post("/v1/weights", {"path": str(weights_file), "version": 5})
        assert r.status_code == 403 and "accept_weights" in r.json()["detail"]
        assert server.get("/v1/models").json()["data"][0]["weights_version"] == 0
        assert server.post("/v1/weights", {"path": str(weights_file), "version": 5},
                           headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_versions_only_move_forward(tiny, weights_file):
    with ServerProcess("models/hf", f"model={tiny}", *OPTIONS, "accept_weights=true", env=ENV) as server:
        assert server.post("/v1/weights", {"path": str(weights_file), "version": 3}).status_code == 200
        for stale in (3, 2, 0):
            r = server.post("/v1/weights", {"path": str(weights_file), "version": stale})
            assert r.status_code == 409 and "version" in r.json()["detail"], stale
        assert server.get("/v1/models").json()["data"][0]["weights_version"] == 3
        truncated = weights_file.with_name("cut.safetensors")
        truncated.write_bytes(weights_file.read_bytes()[: weights_file.stat().st_size // 2])
        r = server.post("/v1/weights", {"path": str(truncated), "version": 4})
        assert r.status_code == 400 and "path" in r.json()["detail"]
        assert server.get("/health").status_code == 200


def test_loaded_tensors_survive_the_file_being_truncated(tmp_path):
    path = tmp_path / "w.safetensors"
    save_tensors({"w": torch.ones(1024, 1024)}, path)
    code = ("import sys; from services.models.hf.weights import read_tensors; t = read_tensors(sys.argv[1]); "
            "open(sys.argv[1], 'r+b').truncate(0); print(float(t['w'].sum()))")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # a mapped file: -7 (SIGBUS)
    assert float(done.stdout.strip()) == 1024 * 1024
