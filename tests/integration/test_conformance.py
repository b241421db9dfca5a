"""`gymserve check` over every server kind: each starts as a real local process (with its helpers)
and passes every conformance check. models/hf and reward_model load torch models: slow."""
from __future__ import annotations

import subprocess
import sys

import pytest

from gymserve.conformance import run_check
from services.core.loader import available_kinds

# models/vllm starts a real vLLM (minutes): test_model_vllm.py runs it, and test_check_token_data.py the
# check that a training-mode model server returns token data
LIGHT = [k for k in available_kinds() if k not in ("models/hf", "models/vllm", "resources/reward_model")] + ["head"]


def assert_passes(kind: str, *options: str) -> None:
    report = run_check(kind, list(options))
    assert report.ok, report.render()
    assert len(report.outcomes) >= 10  # every generic check ran, not just the start-up


@pytest.mark.parametrize("kind", LIGHT)
def test_every_kind_passes_the_conformance_check(kind: str) -> None:
    assert_passes(kind)


@pytest.mark.slow
def test_models_hf_passes_with_the_embedded_model() -> None:
    assert_passes("models/hf", "device=cpu", "default_max_tokens=4")


@pytest.mark.slow
def test_reward_model_passes_with_a_tiny_model(tmp_path) -> None:
    from services.resources.reward_model.tiny_model import build_tiny_reward_model

    model = build_tiny_reward_model(tmp_path / "tiny", seed=2)
    assert_passes("resources/reward_model", f"model_name={model}", "device=cpu", "precision=float32")


def test_unknown_kind_is_a_clear_configuration_error() -> None:
    out = subprocess.run([sys.executable, "-m", "gymserve", "check", "resources/no_such_env"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown server kind 'resources/no_such_env'" in out.stderr
