"""math against NeMo-Gym 0.7.0's own math_with_judge server (library check only, no judge): its
example rows, every response its recorded rollouts hold, and generated right, wrong, malformed
and adversarial responses go to both `/verify`s; the rewards must be equal.

NeMo-Gym's side runs its `LibraryJudgeMathResourcesServer.verify` in its own virtualenv."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymserve.testing import ServerProcess
from tests.compat.nemo_gym import GENEROUS_MATH_VERIFY, text_response

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first compat test may install NeMo-Gym

NEMO_VERIFY = GENEROUS_MATH_VERIFY + """
import asyncio
from resources_servers.math_with_judge.app import (LibraryJudgeMathResourcesServer,
    LibraryJudgeMathResourcesServerConfig, LibraryJudgeMathVerifyRequest)
config = LibraryJudgeMathResourcesServerConfig(host="127.0.0.1", port=1, entrypoint="app.py", name="math",
    judge_model_server={"type": "responses_api_models", "name": "judge"}, should_use_judge=False,
    judge_responses_create_params={"input": []}, library_verifier_timeout_seconds=90)
server = LibraryJudgeMathResourcesServer.model_construct(config=config)
server._library_verifier_semaphore = asyncio.Semaphore(2)
async def main():
    return [(await server.verify(LibraryJudgeMathVerifyRequest.model_validate(body))).reward for body in data]
print(json.dumps(asyncio.run(main())))
"""


def _data_dir(nemo) -> Path:
    [found] = list(nemo.venv.glob("lib/python3.*/site-packages/resources_servers/math_with_judge/data"))
    return found


def generated_answers(gold: str) -> list[tuple[str, bool]]:
    """(response, whether it ends in a closed non-empty box: NeMo-Gym scores any other 0)."""
    return [
        (f"The answer is \\boxed{{{gold}}}.", True), (f"$\\boxed{{ {gold} }}$", True), ("\\boxed{-1}", True),
        (f"\\boxed{{{gold}}} but no, \\boxed{{{gold}1}}", True), (f"The answer is {gold}.", False), ("", False),
        (f"\\boxed{{{gold}", False), ("{" * 40 + f"\\boxed{{x = {gold}}}", True),
    ]


def test_rewards_equal_nemo_gyms_on_its_rows_and_recorded_responses(nemo, workdir):
    data = _data_dir(nemo)
    rows = [json.loads(line) for line in (data / "example.jsonl").read_text().splitlines()]
    recorded = [json.loads(line)["response"] for line in (data / "example_rollouts.jsonl").read_text().splitlines()]
    bodies, boxed = [], []
    for row in rows:
        for response, closed in [(r, True) for r in recorded] + [(text_response(text), closed) for text, closed
                                                                  in generated_answers(row["expected_answer"])]:
            bodies.append({**row, "response": response})
            boxed.append(closed)
    theirs = nemo.python_json(NEMO_VERIFY, bodies, workdir)
    with ServerProcess("resources/math", "math_verify_timeout_s=30", "verify_deadline_s=90") as server:
        ours = [server.post("/verify", body).json().get("reward") for body in bodies]
    # The intended difference: gymserve's math, as NeMo RL's math environment, also finds an answer
    # that is not in a closed \boxed{} ("The answer is 32."); NeMo-Gym's math_with_judge scores those 0
    differ = {i for i in range(len(bodies)) if ours[i] != theirs[i]}
    assert all(not boxed[i] and ours[i] == 1.0 and theirs[i] == 0.0 for i in differ), \
        [(bodies[i]["response"]["output"][-1]["content"][0]["text"][-100:], ours[i], theirs[i]) for i in differ]
    assert [ours[i] for i in range(len(bodies)) if boxed[i]] == [theirs[i] for i in range(len(bodies)) if boxed[i]]
    assert differ and 0 < sum(theirs) < len(theirs)
