"""math with a judge against NeMo-Gym 0.7.0's own math_with_judge server, judge on: both sides ask
the same judge (a `models/stub` on 127.0.0.1 answering one fixed reply per run: equal, not equal,
no label, both labels) about NeMo-Gym's example rows with its recorded and generated responses, and
the rewards must be equal, but for the intended difference: a judge reply gymserve cannot read (no
label, or both) masks the sample where NeMo-Gym scores 0.

NeMo-Gym's side runs its `LibraryJudgeMathResourcesServer.verify` in its own virtualenv, with its own
`ServerClient` sending the judge calls (NeMo-Gym's model-server URL override points it at the stub)."""
from __future__ import annotations

import json

import pytest

from gymserve.testing import ServerProcess
from tests.compat.nemo_gym import GENEROUS_MATH_VERIFY, text_response
from tests.compat.test_math_differential import generated_answers
from tests.contract.servers import start_all, stop_all

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

NEMO_VERIFY = GENEROUS_MATH_VERIFY + """
import asyncio, os
from omegaconf import OmegaConf
from nemo_gym.server_utils import BaseServerConfig, ServerClient
from resources_servers.math_with_judge.app import (LibraryJudgeMathResourcesServer,
    LibraryJudgeMathResourcesServerConfig, LibraryJudgeMathVerifyRequest)
os.environ["NEMO_GYM_MODEL_SERVER_NAME"] = "judge"
config = LibraryJudgeMathResourcesServerConfig(host="127.0.0.1", port=1, entrypoint="app.py", name="math",
    judge_model_server={"type": "responses_api_models", "name": "judge"}, should_use_judge=True,
    judge_responses_create_params={"input": []}, library_verifier_timeout_seconds=90)
client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
                      global_config_dict=OmegaConf.create({}))
server = LibraryJudgeMathResourcesServer.model_construct(config=config, server_client=client)
server._library_verifier_semaphore = asyncio.Semaphore(2)
async def main():
    out = []
    for url in data["judge_urls"]:  # read at every call: one judge after the other
        os.environ["NEMO_GYM_MODEL_SERVER_BASE_URL"] = url
        replies = [await server.verify(LibraryJudgeMathVerifyRequest.model_validate(body)) for body in data["bodies"]]
        out.append([[r.reward, r.judge_evaluations is not None] for r in replies])
    return out
print(json.dumps(asyncio.run(main())))
"""

# (the judge's one reply, whether gymserve reads a verdict from it)
JUDGES = [("The two answers agree. [[A=B]]", True), ("They differ: [[A!=B]]", True),
          ("I cannot decide.", False), ("[[A=B]] or rather [[A!=B]]", False)]


def _bodies(nemo) -> list[dict]:
    """NeMo-Gym's first example row with its recorded responses and the math test's generated ones
    that end in a closed box (the others are the math test's own intended difference: no judge asked)."""
    [data] = list(nemo.venv.glob("lib/python3.*/site-packages/resources_servers/math_with_judge/data"))
    rows = [json.loads(line) for line in (data / "example.jsonl").read_text().splitlines()][:1]
    recorded = [json.loads(line)["response"] for line in (data / "example_rollouts.jsonl").read_text().splitlines()]
    return [{**row, "response": response} for row in rows for response in
            recorded + [text_response(text) for text, boxed in generated_answers(row["expected_answer"]) if boxed]]


def test_judged_rewards_equal_nemo_gyms(nemo, workdir):
    bodies = _bodies(nemo)
    judges = [ServerProcess("models/stub", f"text={json.dumps(reply)}", name=f"judge-{i}", env={"GYMSERVE_NO_AUTH": "1"})
              for i, (reply, _) in enumerate(JUDGES)]
    maths = [ServerProcess("resources/math", "should_use_judge=true", f"judge_model_server={judge.url}",
                           "math_verify_timeout_s=30", "verify_deadline_s=90", name=f"math-{i}")
             for i, judge in enumerate(judges)]
    start_all(judges + maths)
    try:
        theirs_by_judge = nemo.python_json(NEMO_VERIFY, {"judge_urls": [j.url for j in judges], "bodies": bodies},
                                           workdir)
        ours_by_judge = [[math.post("/verify", body).json() for body in bodies] for math in maths]
    finally:
        stop_all(judges + maths)
    for (_, readable), theirs, ours in zip(JUDGES, theirs_by_judge, ours_by_judge):
        _compare(bodies, ours, theirs, readable)


def _compare(bodies: list[dict], ours: list[dict], theirs: list[list], readable: bool) -> None:
    asked = [judged for _, judged in theirs]
    assert any(asked) and not all(asked)  # some answers math-verify settles, some go to the judge
    for body, mine, (their_reward, judged) in zip(bodies, ours, theirs):
        text = body["response"]["output"][-1]["content"][0]["text"][-80:]
        if mine.get("mask_sample"):
            # the intended difference: only a judge reply without one clear verdict, only where NeMo-Gym asked it
            # (NeMo-Gym scores those 0 when there is no label, and reads the first label when there are both)
            assert not readable and judged and "judge" in mine["failure_reason"], (text, mine)
        else:
            assert mine["reward"] == their_reward, (text, mine["reward"], their_reward)
            assert (mine.get("judge_evaluations") is not None) == judged, text
    if not readable:
        assert sum(1 for r in ours if r.get("mask_sample")) == sum(asked)
