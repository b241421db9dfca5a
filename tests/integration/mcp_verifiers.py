"""Verifiers the MCP-server environment test names in its stack (`verifier: module:function`)."""
from __future__ import annotations

from typing import Any


def converted_time(row: dict[str, Any], answer: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """1.0 when the answer states the expected time and the rollout asked the server to convert it."""
    used = any(call["name"] == "convert_time" for call in calls)
    return {"reward": float(used and row["expected_answer"] in answer), "used_convert_time": used}


def broken(row: dict[str, Any], answer: str, calls: list[dict[str, Any]]) -> float:
    raise RuntimeError("a bug in the stack's verifier")
