"""End to end: `gymserve train -c deploy/train/smoke_cpu.yaml` runs 2 real GRPO optimizer steps of
SmolLM2-135M on CPU against real servers (head, models/hf, code_jaccard, simple_agent) and
the weights change."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration._trainer_stack import small_stack

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_smoke_cpu_training_changes_weights(tmp_path):
    import torch
    from safetensors.torch import load_file

    from services.models.hf.embedded import embedded_model_dir

    servers = [("models/hf", "policy_model", ["accept_weights=true"]),
               ("resources/code_jaccard", "code_jaccard", []),
               ("agents/simple_agent", "code_jaccard_simple_agent",
                ["resources_server=code_jaccard", "model_server=policy_model"])]
    out = tmp_path / "run"
    with small_stack(servers, ready_timeout_s=300) as (head, _):
        env = {**os.environ, "GYMSERVE_HEAD_URL": head.url, "PYTHONUNBUFFERED": "1"}
        result = subprocess.run([sys.executable, "-m", "gymserve", "train", "-c",
                                 str(REPO / "deploy/train/smoke_cpu.yaml"), f"output_dir={out}"],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=2200)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "loss" in line]
    assert [line["step"] for line in steps] == [1, 2]
    for line in steps:
        for key in ("loss", "reward", "rewards/env_reward/mean", "kl"):
            assert key in line, (key, line)
    before = load_file(str(next(Path(embedded_model_dir()).glob("*.safetensors"))))
    after = load_file(str(out / "final" / "model.safetensors"))
    changed = [name for name, value in after.items()
               if name in before and not torch.equal(before[name].float(), value.float())]
    assert changed, "no parameter changed after 2 optimizer steps"
