"""NeMo-Gym code_gen rows: `verifier_metadata.unit_tests` ({inputs, outputs}, LiveCodeBench format).

Those rows are judged as NeMo-Gym 0.7.0 judges them, so a NeMo-Gym dataset scores the same here:
the code between the last two fence lines (no fence pair: reward 0), outputs compared line by line
after stripping (yes/no case-insensitively, numbers with a 1e-6 float tolerance), all-or-nothing
reward, and 0 when the final answer holds a `<think>` tag. The run itself is our sandbox.
"""
from __future__ import annotations

import base64
import binascii
import json
import zlib
from decimal import Decimal, InvalidOperation
from typing import Any

from services.core.errors import BadRequest

FIELD = "verifier_metadata.unit_tests"
_FLOAT_TOLERANCE = Decimal("1e-6")
_VERDICTS = ("yes", "no")


def is_nemo_row(row: dict[str, Any]) -> bool:
    """A row in NeMo-Gym's format: unit tests under verifier_metadata, none of ours."""
    meta = row.get("verifier_metadata")
    return isinstance(meta, dict) and "unit_tests" in meta and row.get("tests") is None \
        and row.get("test_code") is None


def parse_unit_tests(row: dict[str, Any], max_tests: int) -> list[dict[str, str]]:
    """`verifier_metadata.unit_tests` as our [{input, output}] tests; plain or zlib-packed; 4xx names the field."""
    raw = row["verifier_metadata"]["unit_tests"]
    if not isinstance(raw, dict):
        raise BadRequest(f"{FIELD}: expected an object {{inputs, outputs}}")
    if raw.get("fn_name") is not None:
        raise BadRequest(f"{FIELD}.fn_name: call-based (function) tests are not supported; stdin/stdout only")
    if "packed" in raw:
        try:
            raw = json.loads(zlib.decompress(base64.b64decode(raw["packed"], validate=True)))
        except (TypeError, ValueError, binascii.Error, zlib.error):
            raise BadRequest(f"{FIELD}.packed: expected base64 of zlib-compressed JSON {{inputs, outputs}}") from None
        if not isinstance(raw, dict):
            raise BadRequest(f"{FIELD}.packed: expected an object {{inputs, outputs}}")
    inputs, outputs = raw.get("inputs"), raw.get("outputs")
    for name, value in (("inputs", inputs), ("outputs", outputs)):
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise BadRequest(f"{FIELD}.{name}: expected a non-empty list of strings")
    assert isinstance(inputs, list) and isinstance(outputs, list)
    if len(inputs) != len(outputs):
        raise BadRequest(f"{FIELD}: {len(inputs)} inputs but {len(outputs)} outputs")
    if len(inputs) > max_tests:
        raise BadRequest(f"{FIELD}: {len(inputs)} tests exceeds max_tests={max_tests}")
    return [{"input": i, "output": o} for i, o in zip(inputs, outputs)]


def extract_code(text: str) -> str:
    """The lines between the last two lines holding a fence (any language tag); '' without two."""
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return ""
    return "\n".join(lines[fences[-2] + 1:fences[-1]])


def has_think_tag(text: str) -> bool:
    return "<think>" in text or "</think>" in text


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(token) for token in line.split()]
    except InvalidOperation:
        return None


def _tokens_match(expected_token: str, got_token: str, expected: Decimal, got: Decimal) -> bool:
    if expected == got:
        return True
    if not any("." in t or "e" in t.lower() for t in (expected_token, got_token)):
        return False
    if not (expected.is_finite() and got.is_finite()):
        return False
    error = abs(expected - got)
    return error <= _FLOAT_TOLERANCE or error / max(abs(expected), Decimal(1)) <= _FLOAT_TOLERANCE


def _line_matches(expected: str, got: str) -> bool:
    if expected == got or (got.lower() in _VERDICTS and got.lower() == expected.lower()):
        return True
    got_numbers, expected_numbers = _decimals(got), _decimals(expected)
    if got_numbers is None or expected_numbers is None or len(got_numbers) != len(expected_numbers):
        return False
    return all(_tokens_match(e_tok, g_tok, e, g) for e_tok, g_tok, e, g
               in zip(expected.split(), got.split(), expected_numbers, got_numbers))


def outputs_match(expected: str, got: str) -> bool:
    """NeMo-Gym's (LiveCodeBench's) stdout comparison."""
    expected_lines, got_lines = _stripped_lines(expected), _stripped_lines(got)
    return len(expected_lines) == len(got_lines) and all(map(_line_matches, expected_lines, got_lines))
