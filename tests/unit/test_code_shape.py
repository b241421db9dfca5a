"""Shape rules the linters do not cover: no module imports another package's private names."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "gymserve", "services", "trainer", "benchmarks", "tests")


def private_imports(source: str) -> list[str]:
    """`from x import _name` lines with an absolute module (a relative import stays inside its package)."""
    return [f"{node.lineno}: from {node.module} import {alias.name}"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__"
            for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]


def test_no_private_names_imported_across_packages() -> None:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if "__pycache__" not in p.parts]
    assert len(files) > 50
    offenders = [f"{path.relative_to(ROOT)}:{line}" for path in files
                 for line in private_imports(path.read_text(encoding="utf-8"))]
    assert not offenders, "private names imported across packages:\n" + "\n".join(offenders)


def test_the_rule_catches_a_private_import_and_allows_relative_ones() -> None:
    source = "from __future__ import annotations\nfrom .app import _local\nfrom services.core.app import _hidden\n"
    assert private_imports(source) == ["3: from services.core.app import _hidden"]
