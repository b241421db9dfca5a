"""instruction_following on NeMo-Gym 0.7.0's own rows and recorded rollouts.

NeMo-Gym's instruction_following server cannot run here (its checks come from
`verifiable-instructions`, which is not on the package index), so its verdicts are the ones its
recorded rollouts hold. Each of its example rows uses an open-instruct/IFBench id we do not
implement: that row is a 400 naming the id. With those ids left out, every recorded
per-instruction verdict for IFEval's ids equals ours, on rows in its `verifier_metadata` format."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymserve.testing import ServerProcess
from services.resources.instruction_following.checks import REGISTRY

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first compat test may install NeMo-Gym


def _data_dir(nemo) -> Path:
    [found] = list(nemo.venv.glob("lib/python3.*/site-packages/resources_servers/instruction_following/data"))
    return found


def test_nemo_gym_rows_are_refused_by_id_and_ifeval_verdicts_equal_its_recorded_ones(nemo):
    data = _data_dir(nemo)
    rows = [json.loads(line) for line in (data / "example.jsonl").read_text().splitlines()]
    rollouts = [json.loads(line) for line in (data / "example_rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == len(rollouts) == 5
    kept, recorded, bodies = [], [], []
    for rollout in rollouts:
        keep = [(iid, kw, verdict) for iid, kw, verdict in zip(rollout["instruction_id_list"], rollout["kwargs"],
                                                               rollout["follow_instruction_list"]) if iid in REGISTRY]
        kept += [iid for iid, _, _ in keep]
        recorded += [verdict for _, _, verdict in keep]
        bodies.append({"id": 1, "responses_create_params": rollout["responses_create_params"],
                       "response": rollout["response"],
                       "verifier_metadata": {"instruction_id_list": [iid for iid, _, _ in keep],
                                             "kwargs": [kw for _, kw, _ in keep], "prompt": rollout["prompt"],
                                             "grading_mode": "binary"}})
    with ServerProcess("resources/instruction_following", "workers=1") as server:
        refused = [server.post("/verify", {**row, "response": rollout["response"]})
                   for row, rollout in zip(rows, rollouts)]
        ours = [result["passed"] for body in bodies for result in server.post("/verify", body).json()["instruction_results"]]
    for row, reply in zip(rows, refused):
        unknown = next(iid for iid in row["instruction_id_list"] if iid not in REGISTRY)
        assert reply.status_code == 400 and unknown in reply.text, reply.text
    assert len(ours) == len(recorded) >= 8 and True in recorded and False in recorded
    assert ours == recorded, list(zip(kept, ours, recorded))
