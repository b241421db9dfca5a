"""mcqa against NeMo-Gym 0.7.0's own mcqa server: NeMo-Gym's example rows (with and without
template metadata) and every response its recorded rollouts hold, plus generated right, wrong,
malformed and adversarial responses, go to both `/verify`s; the rewards must be equal.

NeMo-Gym's side runs its `MCQAResourcesServer.verify` in its own virtualenv, in one process."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymserve.testing import ServerProcess
from tests.compat.nemo_gym import text_response
from tests.compat.compat_page import compared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first compat test may install NeMo-Gym

NEMO_VERIFY = """
import asyncio
from resources_servers.mcqa.app import MCQAResourcesServer, MCQAResourcesServerConfig, MCQAVerifyRequest
config = MCQAResourcesServerConfig(host="127.0.0.1", port=1, entrypoint="app.py", name="mcqa")
server = MCQAResourcesServer.model_construct(config=config)
async def main():
    return [(await server.verify(MCQAVerifyRequest.model_validate(body))).reward for body in data]
print(json.dumps(asyncio.run(main())))
"""


def _data_dir(nemo) -> Path:
    [found] = list(nemo.venv.glob("lib/python3.*/site-packages/resources_servers/mcqa/data"))
    return found


def _generated(row: dict) -> list[str]:
    options = {k: v for entry in row["options"] for k, v in entry.items()}
    gold = row["expected_answer"]
    wrong = next(k for k in options if k != gold)
    return [
        f"\\boxed{{{gold}}}", f"\\boxed{{{{{gold}}}}}", f"\\boxed{{{gold}: {options[gold]}}}",
        f"\\boxed{{\\text{{{gold}}}}}", f"The answer is \\boxed{{({gold})}}.", f"\\boxed{{{wrong}}}",
        f"\\boxed{{{gold}}} no wait \\boxed{{{wrong}}}", f"\\boxed{{{wrong}}} no wait \\boxed{{{gold}}}",
        f"\\boxed{{{options[gold]}}}", f"\\boxed{{{options[wrong]}}}", f"Answer: {gold}", "", "\\boxed{}",
        f"\\boxed{{{gold}", f"\\boxed{{{gold}, {wrong}}}", f"\\boxed{{{gold.lower()}}}", "\\boxed{Z}",
        "{" * 50 + f"\\boxed{{{gold}}}" + "}" * 50, f"\\boxed{{{gold}) {options[gold]}}}",
    ]


def test_rewards_equal_nemo_gyms_on_its_rows_and_recorded_responses(nemo, workdir):
    data = _data_dir(nemo)
    rows = [json.loads(line) for name in ("example.jsonl", "example_with_template_metadata.jsonl")
            for line in (data / name).read_text().splitlines()]
    recorded = [json.loads(line)["response"] for name in ("example_rollouts.jsonl",
                                                          "example_rollouts_with_template_metadata.jsonl")
                for line in (data / name).read_text().splitlines()]
    bodies = []
    for row in rows:
        for response in recorded + [text_response(text) for text in _generated(row)]:
            bodies.append({**row, "response": response})
    # The one intended difference: a row with neither grading_mode nor template_metadata is not a
    # NeMo-Gym row (NeMo-Gym's ship both); gymserve reads it with its own, more lenient default patterns
    plain = {k: v for k, v in rows[0].items() if k != "grading_mode"}
    plain_body = {**plain, "response": text_response(f"Answer: {plain['expected_answer']}")}
    theirs = nemo.python_json(NEMO_VERIFY, bodies + [plain_body], workdir)
    with ServerProcess("resources/mcqa") as server:
        ours = [server.post("/verify", body).json()["reward"] for body in bodies + [plain_body]]
    assert (ours.pop(), theirs.pop()) == (1.0, 0.0)
    differ = [(i, bodies[i]["response"]["output"][-1]["content"][0]["text"][-120:], ours[i], theirs[i])
              for i in range(len(bodies)) if ours[i] != theirs[i]]
    assert not differ, f"{len(differ)} of {len(bodies)} rewards differ: {differ[:10]}"
    compared("mcqa", len(bodies))
    assert 0 < sum(ours) < len(ours)
