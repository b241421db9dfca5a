"""`make demo` end to end: `gymserve.demo.main()` starts the demo stack (default + demo.yaml), collects
one row per environment for the embedded policy and every example row's reference answer through a
scripted policy, prints one table, writes summary.json and stops the stack."""
from __future__ import annotations

import json

import pytest

from gymserve import demo, demo_reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def test_demo_runs_every_environment_and_its_references_score_the_maximum(tmp_path, capsys) -> None:
    code = demo.main(["--out", str(tmp_path)])  # the defaults `make demo` runs with
    out = capsys.readouterr().out
    envs = sorted(path.parent.name for path in demo.example_datasets())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert code == 0, out[-4000:]
    assert sorted(e["environment"] for e in summary) == envs
    problem = demo.sandbox_problem()
    for e in summary:
        env = e["environment"]
        if problem and env in demo.SANDBOXED:  # left out, and the demo says why in one line
            assert e["rollouts"] == 0 and problem in e["reason"] and problem in out
            continue
        assert e["rollouts"] == 1, (env, e)
        assert e["scored"] + e["masked"] == 1
        if e["masked"] == e["rollouts"]:  # fully masked: only with the reason, in the table too
            assert e["reason"].startswith("every rollout masked") and env in out, (env, e)
        maximum = demo_reference.spec(env).maximum
        assert e["reference_max"] == maximum
        if maximum is None:  # reward_model: a score, no maximum, and the note says why
            assert isinstance(e["reference_reward"], float) and "no reference answer" in e["reference_note"]
        else:
            assert e["reference_reward"] == pytest.approx(maximum), (env, e)
        rollouts = (tmp_path / f"{env}.jsonl").read_text().splitlines() + \
            (tmp_path / f"{env}_failures.jsonl").read_text().splitlines()
        assert len(rollouts) == 1
        # the references of every example row, each scored (none masked)
        reference = [json.loads(line) for line in (tmp_path / "reference" / f"{env}.jsonl").read_text().splitlines()]
        rows = demo.example_datasets()[envs.index(env)].read_text().splitlines()
        assert len(reference) == len(rows) == e["reference_rollouts"] and not e["reference_masked"], (env, e)
    judged = {e["environment"]: e.get("judge") for e in summary if e.get("judge")}
    assert set(judged) == {"equivalence_llm_judge", "llm_judge", "genrm_compare"}
    assert all(j.startswith("rule judge") for j in judged.values()), judged
    # the reward model's score came from its model, not from a reference
    assert "reward_model_score" in json.loads((tmp_path / "reward_model.jsonl").read_text())

    # quiet: apart from the table, one screen; the log file, the phases, the files and the next command
    table = [line for line in out.splitlines() if line[:1] in "┏┃┡│└" or "gymserve demo:" in line]
    assert len(table) >= len(envs) + 4
    rest = [line for line in out.splitlines() if line not in table]
    assert len(rest) <= 60, "\n".join(rest)
    assert f"server logs: {tmp_path / 'servers.log'}" in out and (tmp_path / "servers.log").stat().st_size > 0
    assert "Loading" not in out and "%|" not in out  # no weight-loading or download progress bars
    assert any(line.startswith("phases: start-up ") and "collection" in line and "stop" in line for line in rest)
    assert f"{tmp_path / 'summary.json'}" in out and "next: " in out
