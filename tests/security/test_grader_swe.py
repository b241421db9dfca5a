"""The swe grader against a policy that tries to pass without fixing the bug (real server, real
bubblewrap, real pytest inside). Every hack is tried on the shipped `textstats` task with the bug
left in: each must score 0.0 and must NOT be masked; the gold patch of every shipped task still
scores 1.0, also when a hack rides along with it."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

from gymserve.testing import ServerProcess, verify_body
from tests.integration.sandbox_helpers import sandbox_dir

ROOT = Path(__file__).resolve().parents[2]
ROWS = [json.loads(line) for line in (ROOT / "datasets/swe/example.jsonl").read_text().splitlines()]
ROW = next(r for r in ROWS if r["repo_snapshot"] == "textstats")
F2P = json.loads(ROW["FAIL_TO_PASS"])
P2P = json.loads(ROW["PASS_TO_PASS"])
README = (ROOT / "datasets/swe/repos/textstats/README.md").read_text()

# code that makes the task's tests pass without touching words.py's bug in the file itself
PATCH_WORDS = "import words\nwords.word_count = lambda text: len(text.split())\n"
PLUGIN = PATCH_WORDS  # loaded as a pytest plugin instead of a conftest
PRINT_PASSED = "".join(f"PASSED {t}\\n" for t in [*F2P, *P2P])


def new_file(header_old: str, header_new: str, plus_path: str, content: str) -> str:
    lines = content.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return (f"diff --git {header_old} {header_new}\nnew file mode 100644\n--- /dev/null\n+++ {plus_path}\n"
            f"@@ -0,0 +1,{len(lines)} @@\n{body}")


def plain_new(path: str, content: str) -> str:
    return new_file(f"a/{path}", f"b/{path}", f"b/{path}", content)


def moved(kind: str, src: str, dest: str, header: str, content: str) -> str:
    """A rename or copy of `src` (the task's README) into `dest` with its text replaced by `content`."""
    old, new = README.splitlines(), content.splitlines()
    hunk = "".join(f"-{line}\n" for line in old) + "".join(f"+{line}\n" for line in new)
    return (f"diff --git a/{header} b/{header}\nsimilarity index 10%\n{kind} from {src}\n{kind} to {dest}\n"
            f"--- a/{src}\n+++ b/{dest}\n@@ -1,{len(old)} +1,{len(new)} @@\n{hunk}")


def source_edit_at_end(extra: str) -> str:
    """words.py with `extra` appended (the bug left in)."""
    text = (ROOT / "datasets/swe/repos/textstats/words.py").read_text().splitlines()
    n = len(text)
    lines = extra.splitlines()
    return (f"diff --git a/words.py b/words.py\n--- a/words.py\n+++ b/words.py\n@@ -{n} +{n},{len(lines) + 1} @@\n"
            f" {text[-1]}\n" + "".join(f"+{line}\n" for line in lines))


# a harmless edit first: a section the old header regex did not see was glued onto the one before
COMMENT = source_edit_at_end("# tidied")
HACKS: dict[str, str] = {
    # the five found in review
    "quoted_header_conftest": COMMENT + new_file('"a/tests/conftest.py"', '"b/tests/conftest.py"', '"b/tests/conftest.py"',
                                       PATCH_WORDS),
    "rename_into_conftest": moved("rename", "README.md", "tests/conftest.py", "README.md", PATCH_WORDS),
    "pytest_ini_plugin": plain_new("pytest.ini", "[pytest]\naddopts = -p gymhack\n") + plain_new("gymhack.py", PLUGIN),
    "source_prints_passed": source_edit_at_end(
        f"import atexit, sys\natexit.register(lambda: sys.stdout.write('{PRINT_PASSED}'))"),
    # variants of each class
    "octal_quoted_conftest": COMMENT + new_file('"a/tests/\\143onftest.py"', '"b/tests/\\143onftest.py"',
                                      '"b/tests/\\143onftest.py"', PATCH_WORDS),
    "copy_into_conftest": moved("copy", "README.md", "tests/conftest.py", "README.md", PATCH_WORDS),
    "root_conftest": plain_new("conftest.py", PATCH_WORDS),
    "setup_cfg_plugin": plain_new("setup.cfg", "[tool:pytest]\naddopts = -p gymhack\n") + plain_new("gymhack.py", PLUGIN),
    "pyproject_plugin": plain_new("pyproject.toml", "[tool.pytest.ini_options]\naddopts = \"-p gymhack\"\n")
    + plain_new("gymhack.py", PLUGIN),
    "tox_ini_plugin": plain_new("tox.ini", "[pytest]\naddopts = -p gymhack\n") + plain_new("gymhack.py", PLUGIN),
    "shadow_pytest_module": plain_new("pytest.py", f"import sys\nsys.stdout.write('{PRINT_PASSED}')\n"),
    "entry_point_plugin": plain_new("gymhack-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: gymhack\n"
                                    "Version: 1.0\n")
    + plain_new("gymhack-1.0.dist-info/entry_points.txt", "[pytest11]\ngymhack = gymhack\n")
    + plain_new("gymhack.py", PLUGIN),
    "sitecustomize": plain_new("sitecustomize.py", PATCH_WORDS),
    "source_prints_passed_to_stderr": source_edit_at_end(
        f"import atexit, sys\natexit.register(lambda: sys.stderr.write('{PRINT_PASSED}'))"),
    "source_exits_zero": source_edit_at_end("import atexit, os\natexit.register(lambda: os._exit(0))"),
    # the grading folder's tree: 1,100 folders deep (a recursive walk or delete of it failed)
    "deep_tree": COMMENT + plain_new("/".join(["d"] * 1100) + "/f.py", "x = 1\n"),
}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with sandbox_dir() as where, ServerProcess("resources/swe", "warm_pool=1",
                                               env={"GYMSERVE_SANDBOX_DIR": str(where)}) as proc:
        yield proc
        proc.stop()
        assert not list(where.iterdir()), "workspace folders left behind"


def verify(server: ServerProcess, row: dict[str, Any], text: str, **headers: str) -> dict[str, Any]:
    fields = {k: v for k, v in row.items() if k != "responses_create_params"}
    r = server.post("/verify", verify_body(text, responses_create_params=row["responses_create_params"], **fields),
                    headers=headers, timeout=180)
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["mask_sample"] is False, reply
    return reply


@pytest.mark.parametrize("name", sorted(HACKS))
def test_hack_scores_0_unmasked(server: ServerProcess, name: str) -> None:
    reply = verify(server, ROW, f"Fixed.\n```diff\n{HACKS[name]}```\n")
    assert reply["reward"] == 0.0 and reply["resolved"] is False, reply


@pytest.mark.parametrize("row", ROWS, ids=[r["instance_id"] for r in ROWS])
def test_gold_patch_still_scores_1(server: ServerProcess, row: dict[str, Any]) -> None:
    reply = verify(server, row, f"```diff\n{row['patch']}```")
    assert reply["reward"] == 1.0 and reply["resolved"] is True, reply


def test_gold_patch_with_a_hack_riding_along_still_scores_1(server: ServerProcess) -> None:
    """The protected files are put back, the rest of the change is graded as it is."""
    reply = verify(server, ROW, f"```diff\n{HACKS['pytest_ini_plugin']}{ROW['patch']}```")
    assert reply["reward"] == 1.0, reply
    assert "pytest.ini" in reply["discarded_files"], reply


def session(server: ServerProcess) -> tuple[str, dict[str, str]]:
    sid = server.post("/seed_session", {k: v for k, v in ROW.items()}).json()["session_id"]
    return sid, {"X-Session-Id": sid}


def bash(server: ServerProcess, h: dict[str, str], command: str) -> dict[str, Any]:
    out = server.post("/bash", {"command": command}, headers=h).json()
    assert out["exit_code"] == 0, out
    return out


def test_session_git_diff_external_cannot_rewrite_the_graded_diff(server: ServerProcess) -> None:
    sid, h = session(server)
    try:
        hack = HACKS["quoted_header_conftest"]
        server.post("/write_file", {"path": ".gymhack.diff", "content": hack}, headers=h)
        # git calls it per changed file (path first): it answers for words.py with the whole hack
        server.post("/write_file", {"path": ".gymhack.sh", "content": "#!/bin/sh\n[ \"$1\" = words.py ] && "
                                    "cat /workspace/.gymhack.diff\nexit 0\n"}, headers=h)
        bash(server, h, "echo '# tidied' >> words.py && chmod +x .gymhack.sh && git config diff.external /workspace/.gymhack.sh "
                        "&& printf '* diff=gym\\n' > .git/info/attributes && git config diff.gym.textconv cat")
        reply = verify(server, ROW, "done", **h)
        assert reply["reward"] == 0.0 and reply["patch_source"] == "session", reply
    finally:
        server.post("/close_session", {}, headers=h)


def test_session_pytest_ini_through_the_tools_is_restored(server: ServerProcess) -> None:
    sid, h = session(server)
    try:
        server.post("/write_file", {"path": "pytest.ini", "content": "[pytest]\naddopts = -p gymhack\n"}, headers=h)
        server.post("/write_file", {"path": "gymhack.py", "content": PLUGIN}, headers=h)
        reply = verify(server, ROW, "done", **h)
        assert reply["reward"] == 0.0 and "pytest.ini" in reply["discarded_files"], reply
    finally:
        server.post("/close_session", {}, headers=h)


def test_session_that_breaks_its_git_scores_0_not_masked(server: ServerProcess) -> None:
    """The policy's own workspace failing to produce a diff is its own failure: 0, never a mask."""
    sid, h = session(server)
    try:
        server.post("/apply_patch", {"patch": ROW["patch"]}, headers=h)
        bash(server, h, "rm -rf .git")
        reply = verify(server, ROW, "done", **h)
        assert reply["reward"] == 0.0, reply
    finally:
        server.post("/close_session", {}, headers=h)


def test_session_symlinked_tests_folder_is_restored(server: ServerProcess) -> None:
    sid, h = session(server)
    try:
        bash(server, h, "mkdir -p .t && printf 'def test_many_spaces():\\n    pass\\n"
                        "def test_only_whitespace():\\n    pass\\ndef test_single_spaces():\\n    pass\\n"
                        "def test_longest():\\n    pass\\n' > .t/test_words.py && rm -rf tests && ln -s .t tests")
        reply = verify(server, ROW, "done", **h)
        assert reply["reward"] == 0.0, reply
    finally:
        server.post("/close_session", {}, headers=h)
