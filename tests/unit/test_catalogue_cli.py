"""`gymserve catalogue`: every environment this install can serve, as JSON `{name, source, runs_here, reason}`,
and a stack scaffolded for a chosen set that `gymserve up` accepts."""
from __future__ import annotations

import json
import subprocess
import sys

from gymserve.launcher import plan
from services.core.config import load_stack


def catalogue(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gymserve", "catalogue", *args], capture_output=True, text=True,
                          timeout=120)


def test_json_lists_ours_and_nemo_gyms():
    done = catalogue("--json")
    assert done.returncode == 0, done.stderr
    entries = json.loads(done.stdout)
    assert all(set(e) == {"name", "source", "runs_here", "reason"} for e in entries)
    by_name = {e["name"]: e for e in entries}
    assert by_name["resources/math"] == {"name": "resources/math", "source": "gymserve", "runs_here": True,
                                         "reason": None}
    nemo = [e for e in entries if e["name"].startswith("nemo_gym/")]
    assert len(nemo) == 145 and {e["source"] for e in nemo} == {"nemo-gym 0.7.0"}
    assert all(e["runs_here"] or e["reason"] for e in nemo)
    assert by_name["nemo_gym/instruction_following"]["reason"].startswith("package not on the index")


def test_scaffold_writes_a_stack_up_accepts(tmp_path):
    out = tmp_path / "stack.yaml"
    done = catalogue("--scaffold", "resources/math", "nemo_gym/mcqa", "-o", str(out))
    assert done.returncode == 0, done.stderr
    stack = load_stack([out], ["head.port=0"])  # 11000 may be taken by another test
    assert stack.servers["nemo_mcqa"].kind == "nemo_gym/mcqa"
    assert stack.servers["nemo_mcqa_simple_agent"].options["resources_server"] == "nemo_mcqa"
    assert {c.name for c in plan(stack)} >= {"head", "math", "math_simple_agent", "nemo_mcqa", "policy_model"}


def test_an_unknown_name_is_a_clear_error():
    done = catalogue("--scaffold", "nemo_gym/no_such_server")
    assert done.returncode == 2 and "nemo_gym/no_such_server" in done.stderr
