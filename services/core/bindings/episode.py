"""One episode of an environment driven by a protocol other than gymserve's own HTTP (OpenEnv, MCP).

An episode is a gymserve session plus the row it was seeded with and the trajectory the caller built
with tool calls. Ending it with the assistant's answer scores it through the very `/verify` path the
HTTP API uses (the same `checked_verify`, the same reply model and metrics), so a protocol binding
cannot score differently from `/verify` on the same rollout.
"""
from __future__ import annotations

import json
import time
from typing import Any, Callable

from ..content import content_text
from ..errors import BadRequest, Conflict, GymError
from ..resource import Environment, Session, _parse_verify
from ..schemas import VerifyReply

Count = Callable[[VerifyReply], VerifyReply]
# verify reply fields that only echo what the caller sent (left out of an episode's metadata)
_ECHOED = ("responses_create_params", "response")


def prompt_text(row: dict[str, Any]) -> str:
    """The row's user text (`responses_create_params.input`)."""
    messages = (row.get("responses_create_params") or {}).get("input") or []
    if isinstance(messages, str):
        return messages
    return "\n\n".join(content_text(m.get("content")) for m in messages
                       if isinstance(m, dict) and m.get("role", "user") == "user")


def response_object(items: list[dict[str, Any]], text: str) -> dict[str, Any]:
    """A complete Responses object: the tool calls made, their outputs, then the assistant's answer."""
    message = {"type": "message", "id": "msg_episode", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}
    return {"id": "resp_episode", "object": "response", "created_at": time.time(), "model": "policy",
            "status": "completed", "output": [*items, message], "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": []}


class Episode:
    """A session of `env` for one row; `call` records tool calls, `finish` scores and closes it."""

    def __init__(self, env: Environment, count: Count) -> None:
        self.env = env
        self.count = count
        self.session: Session | None = None
        self.row: dict[str, Any] = {}
        self.items: list[dict[str, Any]] = []
        self.steps = 0
        self.done = False

    async def start(self, row: Any, *, session: Session | None = None) -> None:
        """Seed a new session with `row` (or adopt an open `session`, seeded already)."""
        if not isinstance(row, dict):
            raise BadRequest("row: expected the dataset row as a JSON object")
        await self.close()
        self.row, self.items, self.steps, self.done = dict(row), [], 0, False
        if session is not None:
            self.session = session
            return
        sess = self.env.open_session()
        try:
            await self.env.seed(sess, {k: v for k, v in row.items() if k != "resources_session_id"})
        except BaseException:
            self.env.sessions.pop(sess.id, None)
            await self.env.release(sess)
            raise
        self.session = sess

    def _live(self) -> Session:
        if self.session is None or self.done:
            raise Conflict("episode: no episode is running (reset it with a row first)")
        sess = self.env.session(self.session.id, required=True)  # expired sessions are a 409 naming why
        assert sess is not None
        return sess

    async def call(self, name: Any, arguments: Any) -> Any:
        """One tool call on the episode's session; its reply joins the trajectory as the policy saw it."""
        if not isinstance(name, str) or not name:
            raise BadRequest("tool: expected the tool's name as a string")
        sess = self._live()
        self.steps += 1
        call_id = f"call_{len(self.items)}"
        self.items.append({"type": "function_call", "call_id": call_id, "name": name, "status": "completed",
                           "arguments": json.dumps(arguments if arguments is not None else {})})
        try:
            output = await self.env.invoke_tool(sess, name, arguments)
        except GymError as exc:
            self.items.append({"type": "function_call_output", "call_id": call_id,
                               "output": json.dumps({"error": exc.message, "status": exc.status_code})})
            raise
        self.items.append({"type": "function_call_output", "call_id": call_id,
                           "output": json.dumps(output, separators=(",", ":"), ensure_ascii=False)})
        return output

    async def finish(self, text: Any) -> dict[str, Any]:
        """Score the episode with the assistant's final `text` (what `/verify` replies), then close it."""
        if not isinstance(text, str):
            raise BadRequest("text: expected the assistant's answer as a string")
        sess = self._live()
        self.steps += 1
        body = {**self.row, "response": response_object(self.items, text)}
        body.setdefault("responses_create_params", {"input": [{"role": "user", "content": prompt_text(self.row)}]})
        parsed = _parse_verify(body, "row")
        reply = self.count(await self.env.checked_verify(parsed, sess)).dump()
        self.done = True
        await self.close()
        return reply

    async def close(self) -> None:
        if self.session is not None:
            sid, self.session = self.session.id, None
            await self.env.close_session(sid)


def reply_metadata(reply: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """The verify reply without the echo of what the caller sent: reward components, judge details,
    and for a masked rollout `mask_sample`, `failure_kind` and `failure_reason`."""
    return {k: v for k, v in reply.items() if k not in _ECHOED and (k not in row or row[k] != v)}


def episode_reward(reply: dict[str, Any]) -> float | None:
    """The reward an episode ends with: `/verify`'s, or None for a masked rollout (an infrastructure
    failure scores nothing, never 0)."""
    return None if reply.get("mask_sample") else float(reply["reward"])
