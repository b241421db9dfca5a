"""Example rows of an environment, and what a well-formed `/verify` reply looks like."""
from __future__ import annotations

import inspect
import json
import math
from pathlib import Path
from typing import Any

from services.core.schemas import FAILURE_KINDS

from .report import expect

REPO = Path(__file__).resolve().parents[2]
SERVICES = REPO / "services"


def example_files(env: str) -> list[Path]:
    """Where an environment's example rows live: its own folder first, then `datasets/<env>/`; for an
    environment from a package (`env` is its kind), `example.jsonl` beside the module that serves it."""
    from services.core.loader import is_package_kind, load_server

    if not (SERVICES / "resources" / env).is_dir() and is_package_kind(env):
        server = load_server(env)
        module = inspect.getmodule(server) or server
        return [Path(inspect.getfile(module)).resolve().parent / "example.jsonl"]
    return [SERVICES / "resources" / env / "example.jsonl", REPO / "datasets" / env / "example.jsonl"]


def example_rows(env: str, limit: int) -> tuple[Path | None, list[dict[str, Any]]]:
    for path in example_files(env):
        if path.exists():
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            return path, rows[:limit]
    return None, []


def answer_text(row: dict[str, Any]) -> str:
    """A plausible answer for a row (its expected answer when it has a textual one)."""
    for key in ("expected_answer", "answer", "ground_truth"):
        if isinstance(row.get(key), str) and row[key]:
            return row[key]
    return "42"


def response_with_text(text: str) -> dict[str, Any]:
    return {"id": "resp_check", "object": "response", "status": "completed", "model": "check",
            "output": [{"type": "message", "role": "assistant", "id": "msg_check", "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}]}


def verify_body(row: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in row.items() if k != "agent_ref"}, "response": response}


def check_verify_reply(reply: Any, sent: dict[str, Any], where: str) -> float:
    """The reply's reward, after checking the shape every verify reply must have."""
    expect(isinstance(reply, dict), f"{where}: reply is not a JSON object")
    reward = reply.get("reward")
    expect(isinstance(reward, (int, float)) and not isinstance(reward, bool) and math.isfinite(reward),
           f"{where}: reward {reward!r} is not a finite number")
    missing = [k for k in sent if k not in reply]
    expect(not missing, f"{where}: request fields not echoed: {', '.join(missing)}")
    components = reply.get("reward_components")
    if components is not None:
        expect(isinstance(components, dict) and all(isinstance(v, (int, float)) for v in components.values()),
               f"{where}: reward_components must map names to numbers")
        expect(abs(sum(components.values()) - reward) < 1e-6,
               f"{where}: reward {reward} != sum of reward_components {sum(components.values())}")
    if reply.get("mask_sample"):
        expect(reply.get("failure_kind") in FAILURE_KINDS,
               f"{where}: masked reply with failure_kind {reply.get('failure_kind')!r} (expected one of "
               f"{', '.join(FAILURE_KINDS)})")
        expect(isinstance(reply.get("failure_reason"), str) and reply["failure_reason"],
               f"{where}: masked reply without failure_reason")
    return float(reward)
