"""`gymserve new env` in a temporary copy of the project: the generated environment passes
`gymserve check` and its own test as generated, is registered in a stack file, and a broken
one makes the check exit 1 naming the failed checks. Nothing is left behind."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from gymserve.scaffold import new_env
from services.core.config import ConfigError

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


def python(root: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in the copy, importing the copy's packages."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout)


def gymserve(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return python(root, "-m", "gymserve", *args)


STACK_LOADS = ("from services.core.config import load_stack; from gymserve.launcher import check_kind; "
               "stack = load_stack(['deploy/stacks/trivia.yaml']); "
               "[check_kind(name, spec.kind, 'stack') for name, spec in stack.servers.items()]")


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

        own_test = python(root, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/integration/test_env_trivia.py",
                          "tests/unit/test_docs.py", "tests/unit/test_default_stack.py",
                          "-k", "trivia or not fixed_sections")  # the copy lacks the other environments' tests
        assert own_test.returncode == 0, own_test.stdout + own_test.stderr  # the docs and stack rules hold too

        app = folder / "app.py"
        app.write_text(app.read_text().replace("row = parse_row(request)",
                                               'raise RuntimeError("broken on purpose")'))
        broken = gymserve(root, "check", "resources/trivia")
        assert broken.returncode == 1
        assert "FAIL  verify:" in broken.stderr and "checks failed" in broken.stderr

        app.write_text(app.read_text().replace('raise RuntimeError("broken on purpose")', "row = parse_row(request)"))
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
