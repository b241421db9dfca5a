"""Judging a program against a row's tests: extraction, test plans, outcome classification."""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from services.core.errors import BadRequest

from .sandbox import ExecResult

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)
STDERR_TAIL = 600


def extract_program(text: str) -> str:
    """The last fenced ```python block of the response, or the whole text when there is none."""
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def normalise_output(text: str) -> list[str]:
    """Lines with trailing whitespace stripped, trailing empty lines dropped."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


@dataclass(frozen=True)
class Case:
    program: str
    stdin: str = ""
    expected: str | None = None  # stdout to match; None = pass on exit code 0 (assert-style)


def parse_tests(row: dict[str, Any], max_tests: int) -> tuple[str, list[dict[str, str]] | None, str | None, str | None]:
    """Validate `tests` / `test_code` / `entry_point`; a 4xx names the bad field."""
    tests, test_code, entry = row.get("tests"), row.get("test_code"), row.get("entry_point")
    if tests is None and test_code is None:
        raise BadRequest("row has neither tests ([{input, output}]) nor test_code")
    if tests is not None:
        if not isinstance(tests, list) or not tests:
            raise BadRequest("tests: expected a non-empty list of {\"input\": str, \"output\": str}")
        if len(tests) > max_tests:
            raise BadRequest(f"tests: {len(tests)} tests exceeds max_tests={max_tests}")
        for i, test in enumerate(tests):
            if not isinstance(test, dict) or not isinstance(test.get("input", ""), str) \
                    or not isinstance(test.get("output"), str):
                raise BadRequest(f"tests[{i}]: expected {{\"input\": str, \"output\": str}}")
    if test_code is not None and not isinstance(test_code, str):
        raise BadRequest("test_code: expected a string")
    if entry is not None and (not isinstance(entry, str) or not entry.isidentifier()):
        raise BadRequest("entry_point: expected a Python identifier")
    if isinstance(test_code, str):
        try:
            ast.parse(test_code)
        except SyntaxError as exc:
            raise BadRequest(f"test_code: not valid Python: {exc.msg} (line {exc.lineno})") from None
    mode = "stdio" if tests is not None else "assert"
    return mode, tests, test_code, entry


def plan(program: str, tests: list[dict[str, str]] | None, test_code: str | None, entry: str | None) -> list[Case]:
    """One sandboxed run per test. Assert-style: each top-level `assert` of test_code is its own
    test (setup statements run in every one); a HumanEval-style `check(candidate)` is one test."""
    if tests is not None:
        return [Case(program, t.get("input", ""), t["output"]) for t in tests]
    assert test_code is not None
    tree = ast.parse(test_code)
    asserts = [node for node in tree.body if isinstance(node, ast.Assert)]
    calls_check = entry is not None and any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body)
    if calls_check or len(asserts) <= 1:
        suffix = f"\n\ncheck({entry})\n" if calls_check else ""
        return [Case(f"{program}\n\n{test_code}\n{suffix}")]
    setup = [node for node in tree.body if not isinstance(node, ast.Assert)]
    cases = []
    for node in asserts:
        body = ast.unparse(ast.Module(body=[*setup, node], type_ignores=[]))
        cases.append(Case(f"{program}\n\n{body}\n"))
    return cases


def outputs_match(expected: str, got: str) -> bool:
    return normalise_output(got) == normalise_output(expected)


def classify(case: Case, result: ExecResult, cpu_s: float = float("inf"),
             match: Callable[[str, str], bool] = outputs_match) -> dict[str, Any]:
    """Per-test outcome: passed, failure_kind (timeout, memory, output_limit, runtime_error, wrong_answer);
    `match(expected, stdout)` compares a stdio test's output."""
    stderr = result.stderr
    kind: str | None = None
    if result.oom_killed:  # the sandbox's memory cgroup hit its cap (whatever happened next)
        kind = "memory"
    elif result.timed_out or result.signal == 24 or (result.signal == 9 and result.wall_s >= cpu_s):
        # wall clock; SIGXCPU at the soft CPU limit; SIGKILL at the hard one (SIGXCPU ignored)
        kind = "timeout"
    elif result.output_exceeded:
        kind = "output_limit"
    elif "MemoryError" in stderr[-2000:] or "Cannot allocate memory" in stderr[-2000:]:
        kind = "memory"
    elif result.exit_code != 0:
        kind = "wrong_answer" if case.expected is None and "AssertionError" in stderr[-2000:] else "runtime_error"
    elif case.expected is not None and not match(case.expected, result.stdout):
        kind = "wrong_answer"
    out: dict[str, Any] = {"passed": kind is None, "failure_kind": kind, "exit_code": result.exit_code,
                           "time_s": round(result.wall_s, 3)}
    if stderr.strip():
        out["stderr"] = stderr.strip()[-STDERR_TAIL:]
    return out


def reward(results: list[dict[str, Any]], mode: str) -> float:
    passed = sum(1 for r in results if r["passed"])
    if not results:
        return 0.0
    if mode == "all":
        return float(passed == len(results))
    return passed / len(results)
