"""reasoning_gym against NeMo-Gym 0.7.0's own reasoning_gym server: its example rows with every
response its recorded rollouts hold, rows of five more reasoning-gym tasks (generated with the same
reasoning-gym version on both sides), and generated right, wrong, malformed and adversarial
responses go to both `/verify`s; the rewards must be equal.

NeMo-Gym's side runs its `ReasoningGymResourcesServer.verify` in its own virtualenv."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym

from gymserve.testing import ServerProcess
from tests.compat.nemo_gym import text_response
from tests.compat.compat_page import compared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first compat test may install NeMo-Gym

NEMO_VERIFY = """
import asyncio
from resources_servers.reasoning_gym.app import (ReasoningGymResourcesServer, ReasoningGymResourcesServerConfig,
    ReasoningGymVerifyRequest)
config = ReasoningGymResourcesServerConfig(host="127.0.0.1", port=1, entrypoint="app.py", name="reasoning_gym")
server = ReasoningGymResourcesServer.model_construct(config=config)
async def main():
    return [(await server.verify(ReasoningGymVerifyRequest.model_validate(body))).reward for body in data]
print(json.dumps(asyncio.run(main())))
"""

TASKS = ("chain_sum", "fraction_simplification", "word_sorting", "leg_counting", "basic_arithmetic")


def _data_dir(nemo) -> Path:
    [found] = list(nemo.venv.glob("lib/python3.*/site-packages/resources_servers/reasoning_gym/data"))
    return found


def _generated_rows() -> list[dict[str, Any]]:
    """NeMo-Gym's row shape (top-level question, answer, metadata) for other reasoning-gym tasks."""
    rows = []
    for task in TASKS:
        for entry in reasoning_gym.create_dataset(task, size=2, seed=7):
            rows.append({"responses_create_params": {"input": [{"role": "user", "content": entry["question"]}]},
                         "question": entry["question"], "answer": entry["answer"], "metadata": entry["metadata"]})
    return rows


def _responses(answer: str) -> list[str]:
    return [
        f"<answer>{answer}</answer>", f"Thinking first.\n<answer>\n{answer}\n</answer>", f"\\boxed{{{answer}}}",
        f"The answer is {answer}", answer, "<answer>wrong</answer>", f"<answer>{answer}</answer> <answer>no</answer>",
        f"<answer>no</answer> then <answer>{answer}</answer>", f"<answer>{answer}", f"\\boxed{{{answer}",
        f"\\boxed{{\\frac{{1}}{{2}}}} <answer>{answer}</answer>", "\\boxed{x{y}}", "", "   ", "<answer></answer>",
        "{" * 30 + answer, f"<ANSWER>{answer}</ANSWER>",
    ]


def _nested_box(text: str) -> bool:
    """No <answer> tag, and a \\boxed{} whose content holds a brace."""
    start = text.find("\\boxed{")
    return "<answer>" not in text and start >= 0 and "{" in text[start + 7:].split("}", 1)[0]


def test_rewards_equal_nemo_gyms_on_its_rows_generated_rows_and_recorded_responses(nemo, workdir):
    data = _data_dir(nemo)
    rows = [json.loads(line) for line in (data / "example.jsonl").read_text().splitlines()]
    recorded = [json.loads(line)["response"] for line in (data / "example_rollouts.jsonl").read_text().splitlines()]
    bodies = [{**row, "response": response} for row in rows for response in recorded]
    bodies += [{**row, "response": text_response(text)} for row in rows + _generated_rows()
               for text in _responses(row["answer"])]
    theirs = nemo.python_json(NEMO_VERIFY, bodies, workdir)
    with ServerProcess("resources/reasoning_gym", "workers=1") as server:
        replies = [server.post("/verify", body).json() for body in bodies]
    assert not [r for r in replies if r.get("mask_sample")], [r for r in replies if r.get("mask_sample")][:2]
    ours = [r["reward"] for r in replies]
    differ = [(i, bodies[i]["metadata"]["source_dataset"], bodies[i]["response"]["output"][-1]["content"][0]["text"][-80:],
               ours[i], theirs[i]) for i in range(len(bodies)) if ours[i] != theirs[i]]
    # The intended difference: with no <answer> tags, NeMo-Gym reads \boxed{...} up to its first "}"
    # (`\boxed{\dfrac{1}{2}}` gives `\dfrac{1`); gymserve reads the balanced box, the whole answer
    assert differ and all(_nested_box(text) for _, _, text, _, _ in differ), differ[:10]
    assert 0 < sum(theirs) < len(theirs)  # right and wrong answers both seen
    compared("reasoning_gym", len(bodies))
