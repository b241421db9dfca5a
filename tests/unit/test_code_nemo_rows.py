"""NeMo-Gym code_gen rows in the code environment: unit tests, extraction and output comparison."""
from __future__ import annotations

import base64
import json
import zlib

import pytest

from services.core.errors import BadRequest
from services.resources.code import nemo_rows

TESTS = {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]}


def row(unit_tests, **extra):
    return {"verifier_metadata": {"unit_tests": unit_tests}, **extra}


def test_a_nemo_row_is_one_with_unit_tests_and_none_of_ours():
    assert nemo_rows.is_nemo_row(row(TESTS))
    assert not nemo_rows.is_nemo_row(row(TESTS, tests=[{"input": "", "output": "1"}]))
    assert not nemo_rows.is_nemo_row({"verifier_metadata": {"difficulty": "easy"}, "test_code": "assert 1"})


def test_plain_and_packed_unit_tests_become_stdio_tests():
    expected = [{"input": "1 2\n", "output": "3\n"}, {"input": "3 4\n", "output": "7\n"}]
    assert nemo_rows.parse_unit_tests(row(TESTS), 10) == expected
    packed = base64.b64encode(zlib.compress(json.dumps(TESTS).encode())).decode()
    assert nemo_rows.parse_unit_tests(row({"packed": packed, "fn_name": None}), 10) == expected


@pytest.mark.parametrize("unit_tests, field", [
    ([], "unit_tests: expected an object"),
    ({**TESTS, "fn_name": "solve"}, "unit_tests.fn_name"),
    ({"packed": "not base64!"}, "unit_tests.packed"),
    ({"inputs": [], "outputs": []}, "unit_tests.inputs"),
    ({"inputs": ["1"], "outputs": [1]}, "unit_tests.outputs"),
    ({"inputs": ["1", "2"], "outputs": ["1"]}, "2 inputs but 1 outputs"),
    ({"inputs": ["1"] * 3, "outputs": ["1"] * 3}, "exceeds max_tests=2"),
])
def test_bad_unit_tests_are_a_4xx_naming_the_field(unit_tests, field):
    with pytest.raises(BadRequest, match=field.replace(".", r"\.")):
        nemo_rows.parse_unit_tests(row(unit_tests), 2)


def test_code_is_what_lies_between_the_last_two_fence_lines():
    assert nemo_rows.extract_code("a\n```python\nprint(1)\n```\nb\n```\nprint(2)\n```") == "print(2)"
    assert nemo_rows.extract_code("```python\nprint(1)") == ""
    assert nemo_rows.extract_code("print(1)") == ""


@pytest.mark.parametrize("expected, got, same", [
    ("3\n", "  3  \n\n", True),
    ("YES", "yes", True),
    ("YES", "Yes!", False),
    ("Hello", "hello", False),
    ("0.5 2", "0.5000001 2", True),
    ("0.5 2", "0.51 2", False),
    ("10", "10.0000001", True),
    ("50000000000000000", "50000000000000001", False),
    ("1 2", "1 2 3", False),
    ("1\n2", "1", False),
])
def test_outputs_compare_as_nemo_gym_compares_them(expected, got, same):
    assert nemo_rows.outputs_match(expected, got) is same


def test_a_think_tag_in_the_answer_is_seen():
    assert nemo_rows.has_think_tag("done</think>") and not nemo_rows.has_think_tag("no tags")
