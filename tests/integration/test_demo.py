"""`make demo` end to end: `gymserve.demo.main()` starts the embedded default stack, collects one row per
environment (reward_model included), prints the reward table and stops the stack."""
from __future__ import annotations

import json
import re

import pytest

from gymserve import demo
from gymserve.commands.up import DEFAULT_STACK
from services.core.config import load_stack
from tests.unit.test_default_stack import outside_the_default_stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def table_rows(out: str) -> dict[str, list[str]]:
    """The printed table's body rows by environment: cells split on the box character."""
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 7 and cells[0] and cells[0] != "environment":
            rows[cells[0]] = cells
    return rows


def test_demo_collects_and_prints_one_row_per_environment(tmp_path, capsys) -> None:
    outside = outside_the_default_stack()  # need a judge or a sandbox service: skipped, and the demo says so
    envs = sorted(path.parent.name for path in demo.example_datasets())
    served = [env for env in envs if env not in outside]
    assert "reward_model" in served
    code = demo.main(["--rows", "1", "--max-output-tokens", "16", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert sorted(re.findall(r"^skipping (\w+): ", out, re.M)) == sorted(outside & set(envs)), out[-3000:]
    rows = {env: cells for env, cells in table_rows(out).items() if env in served}
    assert sorted(rows) == served, out[-3000:]
    stack = load_stack([DEFAULT_STACK])
    for env, (_, rollouts, mean, scored, masked, failures, rate) in rows.items():
        if "judge_model_server" in stack.servers[env].options and masked == "1":
            # the 135M policy is the judge here: a reply without exactly one verdict label is honestly masked
            failure = json.loads((tmp_path / f"{env}_failures.jsonl").read_text())
            assert (rollouts, scored, failures) == ("1", "0", "upstream: 1") and failure["reward"] is None
            assert re.search(r"(no|conflicting) verdict label", failure["failure_reason"]), failure["failure_reason"]
            assert f"{env}: first failure: " in out
            continue
        assert (rollouts, scored, masked, failures) == ("1", "1", "0", "none"), (env, rows[env])
        record = json.loads((tmp_path / f"{env}.jsonl").read_text())
        assert isinstance(record["reward"], (int, float)) and record["mask_sample"] is False
        assert mean == f"{record['reward']:.3f}" and float(rate) >= 0
    assert "reward_model_score" in json.loads((tmp_path / "reward_model.jsonl").read_text())
    assert "stack stopped (exit 0)" in out
