"""models/vllm's options and the vLLM command it builds: the RL settings are always there."""
from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from services.models.vllm.app import Config
from services.models.vllm.launch import EXTENSION, VLLMServer, model_folder


def _command(**options: object) -> list[str]:
    server = VLLMServer(Config(name="policy_model", vllm_command=["vllm-serve"], **options))  # type: ignore[arg-type]
    server.served_name = "SmolLM2-135M-Instruct"
    return server.command(Path("/models/m"), 4321)


def _value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_rl_settings_are_always_set() -> None:
    command = _command(max_model_len=3072)
    assert command[0] == "vllm-serve"
    assert _value(command, "--max-model-len") == "3072"
    assert _value(command, "--max-num-batched-tokens") == "3072"  # never below max-model-len
    assert _value(command, "--logprobs-mode") == "processed_logprobs"
    assert _value(command, "--worker-extension-cls") == EXTENSION
    assert _value(command, "--host") == "127.0.0.1"
    names = command[command.index("--served-model-name") + 1:command.index("--host")]
    assert names == ["SmolLM2-135M-Instruct", "policy_model"]


def test_batched_tokens_below_the_context_is_refused() -> None:
    with pytest.raises(ValidationError, match="max_num_batched_tokens"):
        Config(max_model_len=4096, max_num_batched_tokens=2048)
    assert _value(_command(max_model_len=2048, max_num_batched_tokens=8192), "--max-num-batched-tokens") == "8192"


def test_dev_endpoints_only_with_accept_weights() -> None:
    assert "VLLM_SERVER_DEV_MODE" not in VLLMServer(Config(vllm_command=["x"])).environment()
    assert VLLMServer(Config(vllm_command=["x"], accept_weights=True)).environment()["VLLM_SERVER_DEV_MODE"] == "1"


def test_a_model_that_is_not_a_local_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no config.json"):
        model_folder(str(tmp_path))
