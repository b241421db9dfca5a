"""Never silently off-policy: weight_sync auto without a policy it can update is an error naming the fix;
off_policy: true allows it and turns importance sampling on."""
from __future__ import annotations

import types
from pathlib import Path

import pytest

from services.core.ports import free_port
from trainer.config import TrainConfigError, load_config
from trainer.train import weight_sync


def _config(tmp_path: Path, *overrides: str):
    path = tmp_path / "train.yaml"
    path.write_text("output_dir: out\ntrain_data: rows.jsonl\n")
    return load_config(str(path), list(overrides))


def test_auto_without_an_updatable_policy_server_is_an_error(tmp_path: Path) -> None:
    head = f"http://127.0.0.1:{free_port()}"  # nothing listens: no policy server can be found
    config = _config(tmp_path)
    assert config.weight_sync.enabled == "auto" and not config.importance_sampling()
    with pytest.raises(TrainConfigError, match="weight_sync.*off_policy=true"):
        weight_sync(config, types.SimpleNamespace(use_vllm=False), head)


def test_off_policy_on_purpose_turns_importance_sampling_on(tmp_path: Path) -> None:
    head = f"http://127.0.0.1:{free_port()}"
    config = _config(tmp_path, "weight_sync.off_policy=true")
    assert weight_sync(config, types.SimpleNamespace(use_vllm=False), head) is None
    assert config.importance_sampling()
    assert not _config(tmp_path, "weight_sync.off_policy=true",
                       "grpo.use_importance_sampling_correction=false").importance_sampling()
