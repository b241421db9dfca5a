"""The demo's parts without starting it: the demo stack checks, every example dataset has an agent and
reference answers routed to a scripted reference agent, and the rule judge's rules give verdicts on
the judged environments' own prompt templates."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gymserve import demo, demo_reference
from services.core.config import load_stack
from services.resources.equivalence_llm_judge.app import JUDGE_PROMPT_TEMPLATE as EQUIVALENCE
from services.resources.genrm_compare.app import JUDGE_PROMPT_TEMPLATE as PAIRWISE
from services.resources.llm_judge.app import JUDGE_PROMPT_TEMPLATE as RUBRIC
from tests.unit.test_default_stack import check_stack
from trainer.client import agent_name
from trainer.jsonl import read_rows

FILES = [demo.STACKS / "default.yaml", demo.STACKS / "demo.yaml"]


@pytest.fixture(scope="module")
def stack():
    return load_stack([str(f) for f in FILES])


def test_the_demo_stack_checks_and_serves_every_example_dataset(stack) -> None:
    check_stack(stack)
    for path in demo.example_datasets():
        env = path.parent.name
        agents = {agent_name(row) or f"{env}_simple_agent" for row in read_rows(path)}
        assert agents <= set(stack.servers), (env, agents)
        reference = stack.servers[f"{env}_reference_agent"].options
        assert (reference["resources_server"], reference["model_server"]) == (env, "reference_model")
    assert stack.servers["reference_model"].kind == "models/stub"


@pytest.mark.parametrize("path", demo.example_datasets(), ids=lambda p: p.parent.name)
def test_every_example_row_has_a_reference_answer(path: Path) -> None:
    rows = read_rows(path)
    refs = demo_reference.reference_rows(path, rows)
    assert refs is not None and len(refs) == len(rows)
    env = path.parent.name
    for row, ref in zip(rows, refs):
        assert ref["agent_ref"]["name"] == f"{env}_reference_agent"
        steps = json.loads(ref["responses_create_params"]["metadata"]["stub_script"])
        assert steps and all(isinstance(s, dict) and ("text" in s or "tool_calls" in s) for s in steps)
        assert {k: v for k, v in ref.items() if k not in ("agent_ref", "responses_create_params")} == \
            {k: v for k, v in row.items() if k not in ("agent_ref", "responses_create_params")}
    side = path.parent / "reference.jsonl"
    if side.exists():  # written by hand next to the rows: one line per row, in order
        ids = [row.get("id", row.get("task_id")) for row in rows]
        assert [line.get("id", ids[i]) for i, line in enumerate(read_rows(side))] == ids


def judge(stack, prompt: str) -> str:
    """What the rule judge (models/stub `rules`) answers to a prompt: the first rule whose regex is found."""
    for rule in stack.servers["rule_judge"].options["rules"]:
        if re.search(rule["match"], prompt):
            return rule["text"]
    return stack.servers["rule_judge"].options["text"]


def test_the_rule_judge_gives_verdicts_on_the_real_templates(stack) -> None:
    ask = lambda gold, answer: judge(stack, EQUIVALENCE.format(  # noqa: E731
        question="Who proposed natural selection?", expected_answer=gold, generated_answer=answer))
    assert ask("Charles Darwin", "It was charles darwin.").endswith("[[A=B]]")
    assert ask("Charles Darwin", "Alfred Wallace").endswith("[[A!=B]]")
    rubric = lambda ref, response: judge(stack, RUBRIC.format(  # noqa: E731
        question="Haiku?", reference=ref, rubric="Three lines.", response=response, score_min=1, score_max=10))
    haiku = "Red and gold leaves\nDrifting down\nCarpet the ground"
    assert rubric(haiku, haiku).endswith("[[10]]")
    assert rubric(haiku, "Leaves.").endswith("[[1]]") and rubric("", "anything").endswith("[[1]]")
    pair = lambda a, b: judge(stack, PAIRWISE.format(question="Prime?", response_a=a, response_b=b))  # noqa: E731
    assert pair("15", "15").endswith("[[A=B]]") and pair("13", "15").endswith("[[A>B]]")


def test_without_bubblewrap_the_sandboxed_environments_leave_the_stack(tmp_path) -> None:
    path = demo.demo_overlay(tmp_path, list(demo.SANDBOXED))
    servers = yaml.safe_load(path.read_text())["servers"]
    assert not [name for name in servers if name.split("_")[0] in demo.SANDBOXED]
    assert "workplace_assistant" in servers and "rule_judge" in servers
    assert demo.demo_overlay(tmp_path, []) == demo.STACKS / "demo.yaml"


def test_the_policy_runs_in_bfloat16_only_on_a_cpu_with_amx_and_never_over_a_users_choice(tmp_path) -> None:
    amx, plain = tmp_path / "amx", tmp_path / "plain"
    amx.write_text("flags\t\t: fpu avx512f amx_bf16 amx_tile\n")
    plain.write_text("flags\t\t: fpu avx512f avx512_bf16\n")
    assert demo.policy_dtype_override([], amx) == ["servers.policy_model.dtype=bfloat16"]
    assert demo.policy_dtype_override([], plain) == []
    assert demo.policy_dtype_override(["servers.policy_model.dtype=float32"], amx) == []
    assert demo.policy_dtype_override([], tmp_path / "missing") == []
