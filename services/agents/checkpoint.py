"""Rollout checkpoints: a rollout whose agent replica dies goes on from its last completed step.

The trainer client names each rollout (`X-Gymserve-Rollout-Id`, the same on every retry of
it). An agent with a checkpoint folder (shared by its replicas, like the resource servers'
session journals) appends one line per completed step: the seeded session, each model call's
output items (token ids and log-probs included) and each tool call's output. A retry that
reaches another replica reads the lines back and continues: outputs already sampled are not
sampled again, and tool calls it sends again carry their original sequence numbers, so the
resource server answers them from its journal instead of applying them twice. The file goes
when the rollout ends.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.core.journal import safe_id

ROLLOUT_HEADER = "X-Gymserve-Rollout-Id"


@dataclass
class Progress:
    """What a rollout had done when its last checkpoint line was written."""

    session_id: str | None = None
    session_url: str | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    pending_calls: list[dict[str, Any]] = field(default_factory=list)


class Checkpoints:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root) / "rollouts"
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, rollout_id: str) -> Path | None:
        return self.root / f"{rollout_id}.jsonl" if safe_id(rollout_id) else None

    def append(self, rollout_id: str, record: dict[str, Any]) -> None:
        path = self.path(rollout_id)
        if path is None:
            return
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)  # one write: a killed writer leaves whole lines
        finally:
            os.close(fd)

    def load(self, rollout_id: str) -> Progress | None:
        path = self.path(rollout_id)
        if path is None or not path.exists():
            return None
        progress = Progress()
        calls_of_last_turn: list[dict[str, Any]] = []
        done_since: int = 0
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                break  # a torn last line: that step did not complete
            progress.session_id = rec.get("session_id", progress.session_id)
            progress.session_url = rec.get("session_url", progress.session_url)
            progress.items.extend(rec.get("items") or [])
            progress.state.update(rec.get("state") or {})
            if rec.get("step") == "model":
                calls_of_last_turn = [i for i in rec.get("items") or [] if i.get("type") == "function_call"]
                done_since = 0
            elif rec.get("step") == "tool":
                done_since += 1
        progress.pending_calls = calls_of_last_turn[done_since:]
        return progress if progress.session_id else None

    def drop(self, rollout_id: str) -> None:
        path = self.path(rollout_id)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
