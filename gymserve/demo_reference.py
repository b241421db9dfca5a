"""The demo's reference column: each example row's own reference answer, as the script of a scripted policy.

A reference row is the example row, routed to the environment's `<env>_reference_agent` (the
same agent kind and resource server as the policy's, with the scripted `reference_model` as its
model) and carrying its answer in `responses_create_params.metadata.stub_script`. It goes through
the same agent -> environment -> verify path as the policy's rollouts, so a reference that does
not score the maximum means an environment (or its data) is broken, not the policy.

Where a row carries its reference (an expected answer, a gold patch, ground-truth tool calls) it
is used as it is; where it cannot (code, terminal, instruction following), the answers live next
to the rows in `datasets/<env>/reference.jsonl`, one line per example row.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

Step = dict[str, Any]


@dataclass(frozen=True)
class ReferenceSpec:
    """How an environment's reference is scored: its best reward, and why that is the best."""

    maximum: float | None
    note: str | None = None


# The reward a correct reference earns, per environment (1.0 unless listed).
SPECS: dict[str, ReferenceSpec] = {
    "math_multi_reward": ReferenceSpec(3.0, "three reward components of 1 each"),
    "genrm_compare": ReferenceSpec(0.5, "the reference against itself: a tie in both orders, 0.5"),
    "reward_model": ReferenceSpec(None, "no reference answer or maximum: a tiny random reward model's score"),
}


def spec(env: str) -> ReferenceSpec:
    return SPECS.get(env, ReferenceSpec(1.0))


def _text(text: Any) -> list[Step]:
    return [{"text": str(text)}]


def _calls(ground_truth: Any, done: str) -> list[Step]:
    """Ground-truth tool calls one per model turn (later calls may depend on earlier ones), then a reply."""
    calls = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    return [{"tool_calls": [{"name": c["name"], "arguments": c["arguments"]}]} for c in calls] + [{"text": done}]


def _mcqa(row: dict[str, Any]) -> list[Step]:
    letter = row["expected_answer"]
    return _text(f"\\boxed{{{letter}}}" if "boxed" in str(row.get("grading_mode") or "") else f"Answer: {letter}")


BUILDERS: dict[str, Callable[[dict[str, Any]], list[Step]]] = {
    "exact_match": lambda r: _text(r["expected_answer"]),
    "math": lambda r: _text(f"The answer is \\boxed{{{r['expected_answer']}}}."),
    "math_multi_reward": lambda r: _text(f"<think>\nThe reference answer.\n</think>\n<answer>\n{r['expected_answer']}\n"
                                         "</answer>"),
    "mcqa": _mcqa,
    "code_jaccard": lambda r: _text(r.get("expected_answer") or r["ground_truth"]),
    "equivalence_llm_judge": lambda r: _text(r["expected_answer"]),
    "llm_judge": lambda r: _text(r["expected_answer"]),
    "reasoning_gym": lambda r: _text(f"<answer>{r['reasoning_gym_entry']['answer']}</answer>"),
    "genrm_compare": lambda r: _text(r["reference_response"]),
    "swe": lambda r: [{"tool_calls": [{"name": "apply_patch", "arguments": {"patch": r["patch"]}}]},
                      {"text": "Applied the fix."}],
    "workplace": lambda r: _calls(r["ground_truth"], "Done."),
    "workplace_assistant": lambda r: _calls(r["ground_truth"], "Done."),
    "reward_model": lambda r: _text("The sea is calm tonight."),
}


def reference_scripts(dataset: Path, rows: list[dict[str, Any]]) -> list[list[Step]] | None:
    """The scripted replies for `rows` (the first rows of `dataset`), or None when the environment has no
    reference answers."""
    env = dataset.parent.name
    side = dataset.parent / "reference.jsonl"
    if side.exists():
        lines = [json.loads(line) for line in side.read_text().splitlines() if line.strip()]
        if len(lines) < len(rows):
            raise ValueError(f"{side}: {len(lines)} reference lines for {len(rows)} rows")
        return [line["steps"] for line in lines[:len(rows)]]
    build = BUILDERS.get(env)
    return None if build is None else [build(row) for row in rows]


def reference_rows(dataset: Path, rows: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """`rows` routed to `<env>_reference_agent`, each carrying its reference answer as the stub's script."""
    scripts = reference_scripts(dataset, rows)
    if scripts is None:
        return None
    env = dataset.parent.name
    out = []
    for row, steps in zip(rows, scripts):
        row = json.loads(json.dumps(row))
        params = row["responses_create_params"]
        metadata = params.get("metadata") if isinstance(params.get("metadata"), dict) else {}
        params["metadata"] = {**metadata, "stub_script": json.dumps(steps)}
        row["agent_ref"] = {"type": "responses_api_agents", "name": f"{env}_reference_agent"}
        out.append(row)
    return out
