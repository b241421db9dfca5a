"""instruction_following on NeMo-Gym 0.7.0's own rows and recorded rollouts.

NeMo-Gym's instruction_following server cannot run here (its checks come from
`verifiable-instructions`, which is not on the package index), so its verdicts are the ones its
recorded rollouts hold: each example row, unchanged, with its recorded response goes to our
server; every per-instruction verdict and every reward must equal NeMo-Gym's. A row with an id
no reference registry has is a 400 naming the id."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymserve.testing import ServerProcess
from tests.compat.compat_page import compared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first compat test may install NeMo-Gym


def _data_dir(nemo) -> Path:
    [found] = list(nemo.venv.glob("lib/python3.*/site-packages/resources_servers/instruction_following/data"))
    return found


def test_verdicts_equal_nemo_gyms_recorded_ones_on_its_rows(nemo):
    data = _data_dir(nemo)
    rows = {json.loads(line)["prompt"]: json.loads(line) for line in (data / "example.jsonl").read_text().splitlines()}
    rollouts = [json.loads(line) for line in (data / "example_rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == len(rollouts) == 5
    # the example rows keep their fields at the top level; the same fields under verifier_metadata too
    bodies = [{**rows[r["prompt"]], "response": r["response"]} for r in rollouts]
    moved = [{"id": b["id"], "responses_create_params": b["responses_create_params"], "response": b["response"],
              "verifier_metadata": {k: b[k] for k in ("instruction_id_list", "kwargs", "prompt")}} for b in bodies]
    with ServerProcess("resources/instruction_following", "workers=1") as server:
        replies = [server.post("/verify", body).json() for body in bodies + moved]
        unknown = server.post("/verify", {**moved[0], "verifier_metadata": {
            **moved[0]["verifier_metadata"], "instruction_id_list": ["count:no_such_check"], "kwargs": [{}]}})
    assert unknown.status_code == 400 and "count:no_such_check" in unknown.text
    recorded = [(r["follow_instruction_list"], r["reward"]) for r in rollouts] * 2
    ours = [(reply["follow_instruction_list"], reply["reward"]) for reply in replies]
    assert ours == recorded
    compared("instruction_following", sum(len(r["follow_instruction_list"]) for r in rollouts))
    assert {True, False} <= {v for verdicts, _ in ours for v in verdicts} and {0.0, 1.0} <= {r for _, r in ours}
