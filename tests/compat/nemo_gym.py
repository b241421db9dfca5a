"""NeMo-Gym 0.7.0 for the compatibility tests: the package's cached virtualenv (`gymserve.nemo_gym.venv`,
which `gymserve up` builds for `kind: nemo_gym/...` servers too), plus the requirements of the NeMo-Gym
servers these tests import in it directly.
"""
from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

from gymserve.nemo_gym import venv as _venv

VERSION = _venv.VERSION
# NeMo-Gym installs each resources server's requirements.txt beside it; these are the ones of the
# servers the differential tests import in the base virtualenv
# (resources_servers/{math_with_judge,reasoning_gym}/requirements.txt); reasoning-gym at the version
# installed here, so both sides score with the same task code
SERVER_REQUIREMENTS = ["math-verify==0.8.0", f"reasoning-gym=={version('reasoning_gym')}"]


def venv() -> Path:
    """The NeMo-Gym virtualenv, created when missing or half-made (a crashed install is redone)."""
    return _venv.base_venv(SERVER_REQUIREMENTS)


# Prepended to a script that runs NeMo-Gym's math_with_judge in its virtualenv: math-verify's default
# 5 s limits raised to the 30 s the tests give gymserve's side (`math_verify_timeout_s=30`). The
# comparisons are about answers, and on a loaded machine one of NeMo-Gym's recorded rollouts takes
# sympy about 5 s, so a limit hit on one side only would turn a slow check into a 0 there. NeMo-Gym
# forks its checker from the script's process, so the raised defaults reach it.
GENEROUS_MATH_VERIFY = """
import functools
import math_verify.metric
math_verify.metric.parse = functools.partial(math_verify.metric.parse, parsing_timeout=30)
math_verify.metric.verify = functools.partial(math_verify.metric.verify, timeout_seconds=30)
"""


def text_response(text: str) -> dict:
    """A complete Responses object whose one message says `text` (what both servers' `/verify` read)."""
    return {"id": "resp_x", "object": "response", "created_at": 1.0, "model": "policy", "status": "completed",
            "output": [{"type": "message", "id": "msg_x", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


# NeMo-Gym-style math rows: no agent_ref (its collector stamps +agent_name); the stub policy always answers 4
MATH_ROWS = [
    {"responses_create_params": {"input": [{"role": "user", "content": "What is 2+2? Answer in \\boxed{}."}]},
     "expected_answer": "4"},
    {"responses_create_params": {"input": [{"role": "user", "content": "What is 3+4? Answer in \\boxed{}."}]},
     "expected_answer": "7"},
]
