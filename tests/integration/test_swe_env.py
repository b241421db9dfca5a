"""resources/swe end to end on the shipped tasks (real server, real bubblewrap, real pytest inside):
the gold patch scores 1, an empty or breaking patch 0, test-file edits are discarded, the session's
workspace diff is graded in a fresh workspace, bad rows are 4xx naming the field."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from gymserve.testing import ServerProcess, verify_body
from tests.integration.sandbox_helpers import sandbox_dir

ROOT = Path(__file__).resolve().parents[2]
ROWS = [json.loads(line) for line in (ROOT / "datasets/swe/example.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with sandbox_dir() as where, ServerProcess("resources/swe", "warm_pool=1",
                                               env={"GYMSERVE_SANDBOX_DIR": str(where)}) as proc:
        yield proc
        proc.stop()
        assert not list(where.iterdir()), "workspace folders left behind"


def body(row: dict[str, Any], text: str) -> dict[str, Any]:
    fields = {k: v for k, v in row.items() if k != "responses_create_params"}
    return verify_body(text, responses_create_params=row["responses_create_params"], **fields)


def verify(server: ServerProcess, row: dict[str, Any], text: str, **headers: str) -> dict[str, Any]:
    r = server.post("/verify", body(row, text), headers=headers, timeout=180)
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["mask_sample"] is False, reply.get("failure_reason")
    return reply


@pytest.mark.parametrize("row", ROWS, ids=[r["instance_id"] for r in ROWS])
def test_gold_patch_scores_1(server: ServerProcess, row: dict[str, Any]) -> None:
    reply = verify(server, row, f"The fix:\n```diff\n{row['patch']}```\n")
    assert reply["reward"] == 1.0 and reply["resolved"] is True, reply
    assert set(reply["tests_status"].values()) == {"PASSED"}
    assert reply["fail_to_pass_passed"] == 1.0 and reply["pass_to_pass_passed"] == 1.0


def test_empty_patch_scores_0(server: ServerProcess) -> None:
    reply = verify(server, ROWS[0], "I could not find the bug.")
    assert reply["reward"] == 0.0 and reply["resolved"] is False and reply["patch_applied"] is False


def test_breaking_patch_scores_0_with_the_failing_tests(server: ServerProcess) -> None:
    row = next(r for r in ROWS if r["repo_snapshot"] == "textstats")
    # fixes the split but breaks longest_word (a PASS_TO_PASS test): a second hunk on the same file
    sabotage = ("@@ -13,2 +13,2 @@ def longest_word(text: str) -> str:\n     words = text.split()\n"
                "-    return max(words, key=len) if words else \"\"\n+    return min(words, key=len) if words else \"\"\n")
    reply = verify(server, row, f"```diff\n{row['patch']}{sabotage}```")
    assert reply["reward"] == 0.0 and reply["resolved"] is False, reply
    assert reply["fail_to_pass_passed"] == 1.0 and reply["pass_to_pass_passed"] < 1.0
    assert reply["tests_status"]["tests/test_words.py::test_longest"] == "FAILED"


def test_test_file_edits_are_discarded(server: ServerProcess) -> None:
    row = next(r for r in ROWS if r["repo_snapshot"] == "intervals")
    cheat = ("diff --git a/tests/conftest.py b/tests/conftest.py\nnew file mode 100644\n--- /dev/null\n"
             "+++ b/tests/conftest.py\n@@ -0,0 +1,2 @@\n+import pytest\n+pytest.skip('x', allow_module_level=True)\n")
    reply = verify(server, row, f"```diff\n{cheat}```")
    assert reply["reward"] == 0.0 and reply["discarded_files"] == ["tests/conftest.py"]
    reply = verify(server, row, f"```diff\n{cheat}{row['patch']}```")
    assert reply["reward"] == 1.0 and reply["discarded_files"] == ["tests/conftest.py"]


def test_session_diff_graded_in_a_fresh_workspace(server: ServerProcess) -> None:
    row = next(r for r in ROWS if r["repo_snapshot"] == "roman")
    seed = {k: v for k, v in row.items()}
    sid = server.post("/seed_session", seed).json()["session_id"]
    h = {"X-Session-Id": sid}
    out = server.post("/bash", {"command": "python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -1"}, headers=h).json()
    assert out["exit_code"] == 0 and "2 passed" in out["stdout"], out
    assert server.post("/apply_patch", {"patch": row["patch"]}, headers=h).json()["exit_code"] == 0
    # an edit of a test file in the session is not graded (it is dropped from the diff)
    server.post("/bash", {"command": "echo 'def test_subtractive(): pass' >> tests/test_numerals.py"}, headers=h)
    reply = verify(server, row, "done", **h)
    assert reply["reward"] == 1.0 and reply["patch_source"] == "session", reply
    assert reply["discarded_files"] == ["tests/test_numerals.py"]


def test_bad_rows_are_4xx_naming_the_field(server: ServerProcess) -> None:
    for field, value in (("repo_snapshot", "../../etc"), ("repo_snapshot", "nope"), ("FAIL_TO_PASS", "[not json"),
                         ("FAIL_TO_PASS", ["--co"])):
        r = server.post("/verify", body({**ROWS[0], field: value}, "```diff\n" + ROWS[0]["patch"] + "```"))
        assert 400 <= r.status_code < 500 and field in r.text, (field, r.status_code, r.text)
    r = server.post("/seed_session", {**ROWS[0], "repo_snapshot": "/etc"})
    assert r.status_code == 400 and "repo_snapshot" in r.text
