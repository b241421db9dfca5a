"""`gymserve new env` in a temporary copy of the project, the newcomer's whole path: the generated
environment passes `gymserve check`, `gymserve up` with the stub policy plus `collect` score its
rows, its own test and the docs and default-stack rules of `make test` pass; a broken verify and a
wrong `expected_reward` make the check exit 1 naming the failed check. Nothing is left behind."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from gymserve.scaffold import new_env
from services.core.config import ConfigError
from tests.integration.up_helpers import Up

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("services", "gymserve", "gateway", "trainer", "datasets", "docs", "mkdocs.yml", "pyproject.toml",
          "tests/__init__.py", "tests/integration/__init__.py", "tests/unit/__init__.py", "tests/unit/test_docs.py",
          "tests/unit/test_default_stack.py", "README.md")


def copy_project(dest: Path) -> None:
    for name in COPIED:
        src, dst = ROOT / name, dest / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dst)


def python(root: Path, *args: str, timeout: float = 400, key: str | None = None) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in the copy, importing the copy's packages (with the stack's key when given)."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    if key:
        env["GYMSERVE_API_KEY"] = key
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)


def gymserve(root: Path, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    return python(root, "-m", "gymserve", *args, key=key)


STACK_LOADS = ("from services.core.config import load_stack; from gymserve.launcher import check_kind; "
               "stack = load_stack(['deploy/stacks/trivia.yaml']); "
               "[check_kind(name, spec.kind, 'stack') for name, spec in stack.servers.items()]")


STUB_POLICY = """servers:
  policy_model:
    _replace: true
    kind: models/stub
    text: "The answer is Paris."
"""


def _up_with_the_stub_and_collect(root: Path) -> None:
    """The guide's step 4 with the stub policy: `gymserve up` on the generated stack, `collect` the rows."""
    (root / "stub_policy.yaml").write_text(STUB_POLICY)
    up = Up("-c", str(root / "deploy/stacks/trivia.yaml"), "-c", str(root / "stub_policy.yaml"), "head.port=0",
            env={"PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}, cwd=root)
    try:
        up.wait_for(r"all 4 servers ready", timeout_s=300)
        head = up.wait_for(r"head on (http://\S+)").group(1)
        out = root / "runs" / "trivia.jsonl"
        collected = gymserve(root, "collect", "-i", "datasets/trivia/example.jsonl", "-o", str(out), "--head", head,
                             "--no-progress", key=up.key)
        assert collected.returncode == 0, collected.stdout + collected.stderr
        assert f"head: {head} (from --head)" in collected.stdout
        rewards = [json.loads(line)["reward"] for line in out.read_text().splitlines()]
        assert sorted(rewards) == [0.0, 0.0, 1.0]  # the stub says Paris: right for the first row only
    finally:
        if up.proc.poll() is None:
            os.killpg(up.proc.pid, signal.SIGINT)
            up.wait(60)
        up.kill()


@pytest.mark.slow
def test_new_env_passes_check_and_its_test_then_a_broken_one_fails() -> None:
    with tempfile.TemporaryDirectory(prefix="gymserve-scaffold-") as tmp:
        root = Path(tmp)
        copy_project(root)
        made = gymserve(root, "new", "env", "trivia")
        assert made.returncode == 0, made.stderr
        folder = root / "services/resources/trivia"
        assert {p.name for p in folder.iterdir()} >= {"__init__.py", "app.py", "README.md"}
        assert (root / "datasets/trivia/example.jsonl").is_file()  # where every environment keeps its rows
        assert (root / "docs/environments/trivia.md").read_text() == '--8<-- "services/resources/trivia/README.md"\n'
        assert "      - trivia: environments/trivia.md\n" in (root / "mkdocs.yml").read_text()
        default = yaml.safe_load((root / "gymserve/stacks/default.yaml").read_text())["servers"]
        assert default["trivia_simple_agent"]["resources_server"] == "trivia"  # make demo shows it
        readme = (folder / "README.md").read_text()
        headings = [line for line in readme.splitlines() if line.startswith("## ")]
        assert headings == ["## Row fields", "## Reward", "## Failure behaviour", "## Options", "## Example",
                            "## Data and tests"]
        assert "](" not in readme  # no links: the docs site includes these files as they are
        stack = yaml.safe_load((root / "deploy/stacks/trivia.yaml").read_text())
        assert stack["servers"]["trivia"] == {"kind": "resources/trivia"}
        assert stack["servers"]["trivia_simple_agent"]["resources_server"] == "trivia"
        assert stack["servers"][stack["servers"]["trivia_simple_agent"]["model_server"]]["kind"].startswith("models/")

        loads = python(root, "-c", STACK_LOADS)
        assert loads.returncode == 0, loads.stderr  # `gymserve up -c deploy/stacks/trivia.yaml` accepts it
        check = gymserve(root, "check", "resources/trivia")
        assert check.returncode == 0, check.stdout + check.stderr
        assert "checks passed" in check.stdout and "FAIL" not in check.stdout

        _up_with_the_stub_and_collect(root)

        own_test = python(root, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/integration/test_env_trivia.py",
                          "tests/unit/test_docs.py", "tests/unit/test_default_stack.py",
                          "-k", "trivia or not fixed_sections")  # the copy lacks the other environments' tests
        assert own_test.returncode == 0, own_test.stdout + own_test.stderr  # the docs and stack rules hold too
        docs = python(root, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(root / "site"))
        assert docs.returncode == 0, docs.stdout + docs.stderr
        assert (root / "site/environments/trivia/index.html").is_file()

        app = folder / "app.py"
        app.write_text(app.read_text().replace("row: Row = self.parse_row(request)",
                                               'raise RuntimeError("broken on purpose")'))
        broken = gymserve(root, "check", "resources/trivia")
        assert broken.returncode == 1
        assert "FAIL  verify:" in broken.stderr and "checks failed" in broken.stderr

        app.write_text(app.read_text().replace('raise RuntimeError("broken on purpose")', "row: Row = self.parse_row(request)"))
        rows_file = root / "datasets/trivia/example.jsonl"
        rows_file.write_text(rows_file.read_text().replace('"expected_reward": 1.0', '"expected_reward": 0.5', 1))
        wrong_reward = gymserve(root, "check", "resources/trivia")
        assert wrong_reward.returncode == 1 and "expected_reward is 0.5" in wrong_reward.stderr, wrong_reward.stderr
    assert not root.exists()


def test_new_env_refuses_bad_names_existing_envs_and_clashing_stack_entries(tmp_path) -> None:
    (tmp_path / "services/resources/exact_match").mkdir(parents=True)
    for bad in ("Bad-Name", "1env", "class"):
        with pytest.raises(ConfigError, match="environment name"):
            new_env(bad, tmp_path)
    with pytest.raises(ConfigError, match="exists already"):
        new_env("exact_match", tmp_path)
    stack = tmp_path / "mine.yaml"
    stack.write_text("# my stack\nservers:\n  policy_model: {kind: models/stub}\n")
    new_env("first", tmp_path, stack=stack)
    text = stack.read_text()
    assert text.startswith("# my stack")  # appended, comments kept
    servers = yaml.safe_load(text)["servers"]
    assert servers["policy_model"] == {"kind": "models/stub"} and "first_simple_agent" in servers
    with pytest.raises(ConfigError, match="exist already"):
        shutil.rmtree(tmp_path / "services/resources/first")
        (tmp_path / "tests/integration/test_env_first.py").unlink()
        shutil.rmtree(tmp_path / "datasets/first")
        new_env("first", tmp_path, stack=stack)
    shutil.rmtree(tmp_path)
