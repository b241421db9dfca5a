"""Which task fields each bundled environment needs in a row, so `gymserve prepare` catches
a bad dataset before a training run does. Each requirement is a tuple of alternatives
(any one present is enough); a field may also sit under the row's `metadata` object. The row's
typed task fields are checked with the request model the environment's server parses `/verify`
bodies with, so a row prepare accepts is one the server reads."""
from __future__ import annotations

import functools
from typing import Any

from pydantic import ValidationError

from services.core.loader import available_kinds, load_server
from services.core.schemas import DatasetRow

REQUIRED_FIELDS: dict[str, list[tuple[str, ...]]] = {
    "exact_match": [("expected_answer",)],
    "math": [("expected_answer",)],
    "math_multi_reward": [("expected_answer",)],
    "code_jaccard": [("expected_answer", "ground_truth")],
    "mcqa": [("expected_answer",)],
    "instruction_following": [("instruction_id_list",), ("kwargs",)],
    "reasoning_gym": [("reasoning_gym_entry", "metadata")],
    "terminal": [("check",)],
    "swe": [("instance_id",), ("repo_snapshot", "image"), ("test_patch",), ("FAIL_TO_PASS",)],
}


def env_of_agent(agent: str | None) -> str | None:
    """NeMo-Gym naming: agent `<env>_simple_agent` serves environment `<env>`."""
    if not agent:
        return None
    for suffix in ("_simple_agent", "_multi_turn_agent", "_agent"):
        if agent.endswith(suffix):
            return agent[: -len(suffix)]
    return None


def _present(row: dict[str, Any], name: str) -> bool:
    if row.get(name) is not None:
        return True
    meta = row.get("metadata")
    return isinstance(meta, dict) and meta.get(name) is not None


@functools.cache
def request_model(env: str) -> type | None:
    """The pydantic model environment `env`'s server parses `/verify` bodies with (None: not bundled)."""
    if f"resources/{env}" not in available_kinds():
        return None
    from services.core.resource import Environment

    module = load_server(f"resources/{env}")
    classes = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, Environment)
               and v.__module__ == module.__name__]
    return classes[0].request_model if len(classes) == 1 else None


PLACEHOLDER_RESPONSE = {"id": "prepare", "object": "response", "created_at": 0.0, "model": "prepare",
                        "status": "completed", "output": [], "parallel_tool_calls": True, "tool_choice": "auto",
                        "tools": []}


def _typed_problems(row: dict[str, Any], env: str) -> list[str]:
    model = request_model(env)
    if model is None:
        return []
    try:
        model.model_validate({**row, "response": PLACEHOLDER_RESPONSE})
    except ValidationError as exc:
        return [f"{'.'.join(str(p) for p in err['loc']) or '(row)'}: {err['msg']} (environment {env}'s "
                "verify request)" for err in exc.errors()]
    return []


def _params_problems(params: Any) -> list[str]:
    """What the model allows but no rollout can run on: no prompt, or input items without a role."""
    if not isinstance(params, dict):
        return ["missing responses_create_params (an object with `input`)"]
    messages = params.get("input")
    if not messages or not isinstance(messages, (str, list)):
        return ["responses_create_params.input: missing or empty"]
    if isinstance(messages, list):
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or ("role" not in message and "type" not in message):
                return [f"responses_create_params.input[{i}]: expected a message with a role"]
    return []


def row_problems(row: dict[str, Any], env: str | None, extra_required: list[str] | None = None) -> list[str]:
    """Human-readable problems of one row (empty when it is valid)."""
    problems: list[str] = []
    try:  # the model agents parse `POST /run` with: a row it rejects is a 422 naming the field there
        DatasetRow.model_validate(row)
    except ValidationError as exc:
        problems.extend(f"{'.'.join(str(p) for p in err['loc']) or '(row)'}: {err['msg']}" for err in exc.errors())
    if not problems:
        problems.extend(_params_problems(row.get("responses_create_params")))
    if not problems and env:
        problems.extend(_typed_problems(row, env))
    ref = row.get("agent_ref")
    if not (isinstance(ref, dict) and isinstance(ref.get("name"), str) and ref["name"]):
        problems.append("agent_ref.name: missing (set --agent to stamp it)")
    requirements = list(REQUIRED_FIELDS.get(env or "", [])) + [(name,) for name in extra_required or []]
    for alternatives in requirements:
        if not any(_present(row, name) for name in alternatives):
            problems.append(f"missing field {' or '.join(alternatives)} (required by environment {env or 'custom'})")
    return problems
