"""The rollout loop shared by every agent: seed, model call -> tool calls -> tool outputs, verify.

One `Rollout` is one `/run`. It talks to two upstreams (the resource server and the model
server) by instance name through the head's directory, passes the session id to both, and
turns every infrastructure failure into a masked reply (`mask_sample: true` with
`failure_kind`/`failure_reason`) instead of a made-up reward. Subclasses add user turns
(`next_user_message`) for multi-turn conversations.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
import uuid
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator

from services.core.affinity import CALL_SEQ_HEADER, REPLICA_HEADER, SESSION_STORE_ENV
from services.core.auth import trust, trusted
from services.core.client import ServiceClient, shared_client
from services.core.config import ServerConfig, describe_validation_error
from services.core.content import content_text
from services.core.directory import Directory
from services.core.errors import BadRequest, GymError, UpstreamError
from services.core.failures import FailureKind
from services.core.replies import failed_reply
from services.core.redaction import redact_text
from services.core.resource import CLOSE_SESSION_HEADER
from services.core.schemas import DatasetRow

from .checkpoint import Checkpoints, Progress

TRAINING_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
# Endpoints every resource server has: never reachable as tools, whatever the model asks.
RESERVED_PATHS = frozenset({"seed_session", "verify", "close_session", "aggregate_metrics", "health", "ready",
                            "metrics", "docs", "openapi.json", "redoc"})
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
SAMPLING_DEFAULTS = ("max_output_tokens", "temperature", "top_p")
log = logging.getLogger("gymserve.agents")


class AgentConfig(ServerConfig):
    """Options of every agent (simple_agent uses exactly these)."""

    resources_server: str | None = Field(None, description="resource server instance name (resolved by the head)")
    model_server: str | None = Field(None, description="model server instance name (resolved by the head)")
    resources_url: str | None = Field(None, description="explicit resource server URL (overrides the name)")
    model_url: str | None = Field(None, description="explicit model server URL (overrides the name)")
    max_steps: int = Field(10, ge=1, description="most model calls per assistant turn")
    max_total_tokens: int | None = Field(None, gt=0, description="token budget of the whole conversation")
    max_tool_calls: int | None = Field(None, gt=0, description="tool calls of the whole rollout (long coding sessions)")
    mask_on_budget: bool = Field(False, description="a rollout that exhausts max_steps, max_tool_calls or "
                                                    "max_total_tokens is masked (failure_kind timeout), not scored")
    step_deadline_s: float = Field(300.0, gt=0, description="deadline of one model or tool call")
    rollout_deadline_s: float = Field(900.0, gt=0, description="deadline of the whole rollout, verify included")
    verify_deadline_s: float = Field(120.0, gt=0, description="deadline of the /verify call")
    model: str | None = Field(None, description="model name sent when the row has none")
    max_output_tokens: int | None = Field(None, gt=0, description="default when the row sets none")
    temperature: float | None = Field(None, ge=0, description="default when the row sets none")
    top_p: float | None = Field(None, gt=0, le=1, description="default when the row sets none")
    rollout_store: str | None = Field(
        default_factory=lambda: os.environ.get(SESSION_STORE_ENV) or None,
        description="folder shared by this agent's replicas: checkpoints of rollouts in flight, so a retry "
                    "on another replica goes on from the last completed step; unset: none")

    @field_validator("resources_server", "model_server", mode="before")
    @classmethod
    def _nemo_gym_ref(cls, value: Any) -> Any:
        """NeMo-Gym configs write `{type: resources_servers, name: math}`; the name is what counts."""
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            return value["name"]
        return value

    @model_validator(mode="after")
    def _needs_upstreams(self) -> "AgentConfig":
        if not (self.resources_server or self.resources_url):
            raise ValueError("set resources_server (instance name) or resources_url")
        if not (self.model_server or self.model_url):
            raise ValueError("set model_server (instance name) or model_url")
        return self


class RolloutFailure(Exception):
    """An infrastructure failure: the rollout is masked, never scored."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class Upstream:
    """One upstream server found by instance name (or a fixed URL).

    After a transport failure the name is re-resolved once: a restarted server that came
    back on another port is found again instead of failing every later rollout.
    """

    def __init__(self, role: str, name: str | None, url: str | None, directory: Directory,
                 client: ServiceClient) -> None:
        self.role = role
        self.name = name
        self.fixed = url.rstrip("/") if url else None
        if self.fixed:
            trust(self.fixed)  # a URL in the server's own configuration is the stack's: it gets the key
        self.directory = directory
        self.client = client

    def describe(self) -> str:
        return f"{self.role} {self.name!r}" if not self.fixed else f"{self.role} at {self.fixed}"

    async def base(self) -> str:
        if self.fixed:
            return self.fixed
        assert self.name
        return await self.directory.url(self.name)

    async def post(self, path: str, payload: Any, *, session_id: str | None, deadline_s: float,
                   retries: int | None = None, headers: dict[str, str] | None = None) -> Any:
        started = time.monotonic()
        base = await self.base()
        try:
            return await self.client.request("POST", base + path, json=payload, session_id=session_id,
                                             deadline_s=deadline_s, retries=retries, headers=headers)
        except UpstreamError as exc:
            # Only transport failures (nothing answered) are worth a new lookup.
            if self.fixed or exc.kind != FailureKind.UPSTREAM or exc.upstream_status is not None:
                raise
            self.directory.invalidate(self.name)
            fresh = await self.directory.url(self.name)  # type: ignore[arg-type]
            remaining = deadline_s - (time.monotonic() - started)
            if fresh == base or remaining <= 0:
                raise
            return await self.client.request("POST", fresh + path, json=payload, session_id=session_id,
                                             deadline_s=remaining, retries=retries, headers=headers)


def error_message(response: Any) -> str:
    """The `detail` of a gymserve/FastAPI error body, else the raw text."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        detail = body.get("detail")
        if detail is None and isinstance(body.get("error"), dict):
            detail = body["error"].get("message")
        if detail is not None:
            return detail if isinstance(detail, str) else json.dumps(detail)[:500]
    return response.text[:500]


def session_failure(response: Any) -> str:
    """Why a resource server refused a session's call (409): `session_lost` / `session_diverged` when it
    says so, `upstream` otherwise."""
    try:
        kind = response.json()["error"]["failure_kind"]
    except (ValueError, KeyError, TypeError):
        return FailureKind.UPSTREAM
    allowed = (FailureKind.SESSION_LOST.value, FailureKind.SESSION_DIVERGED.value)
    return kind if kind in allowed else FailureKind.UPSTREAM


def parse_row(body: Any) -> dict[str, Any]:
    """Validate a dataset row (the `/run` body); 400 naming the problem."""
    if not isinstance(body, dict):
        raise BadRequest("body: expected a JSON object (a dataset row with responses_create_params)")
    if "responses_create_params" not in body:
        raise BadRequest("responses_create_params: missing (the row must carry the model request)")
    try:
        row = DatasetRow.model_validate(body)
    except ValidationError as exc:
        raise BadRequest(f"invalid dataset row: {describe_validation_error(exc)}") from None
    params = row.responses_create_params
    if not params.input_messages():
        raise BadRequest("responses_create_params.input: empty (nothing to send to the model)")
    for i, spec in enumerate(params.tools or []):
        if not tool_name(spec):
            raise BadRequest(f"responses_create_params.tools[{i}]: a function tool needs a name")
    return body


def tool_name(spec: dict[str, Any]) -> str | None:
    """Name of a tool spec in Responses (`{"name"}`) or Chat Completions (`{"function": {"name"}}`) form."""
    name = spec.get("name")
    if name is None and isinstance(spec.get("function"), dict):
        name = spec["function"].get("name")
    return name if isinstance(name, str) and name else None


def _strip_training(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as model input: token data stays in the trajectory, not in every request."""
    if any(k in item for k in TRAINING_FIELDS):
        return {k: v for k, v in item.items() if k not in TRAINING_FIELDS}
    return item


def user_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def is_terminal(response: Any) -> bool:
    """A tool reply that ends the episode: a JSON object with `terminated` (the code environment's
    `terminate_on_evaluation`), `terminate` or `done` set to true."""
    if "json" not in response.headers.get("content-type", ""):
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and any(body.get(key) is True for key in ("terminated", "terminate", "done"))


def message_text(item: dict[str, Any]) -> str:
    return content_text(item.get("content"))


class Agent:
    """An agent's upstreams and options; `rollout_class` runs one `/run`."""

    rollout_class: type["Rollout"]

    def __init__(self, config: AgentConfig, *, client: ServiceClient | None = None) -> None:
        self.config = config
        self.client = client or shared_client()
        self.directory = Directory(config.head_url, client=self.client)
        self.resources = Upstream("resource server", config.resources_server, config.resources_url,
                                  self.directory, self.client)
        self.model = Upstream("model server", config.model_server, config.model_url, self.directory,
                              self.client)
        self._closing: set[asyncio.Task[Any]] = set()
        self.checkpoints = Checkpoints(config.rollout_store) if config.rollout_store else None

    async def run(self, row: dict[str, Any], rollout_id: str | None = None) -> dict[str, Any]:
        self.rollout_class.check_row(row)
        rollout = self.rollout_class(self, row)
        if rollout_id and self.checkpoints is not None and self.checkpoints.path(rollout_id) is not None:
            rollout.rollout_id = rollout_id
        return await rollout.run()

    def close_later(self, session_id: str) -> None:
        """Close the resource session in the background: the reply does not wait for cleanup."""
        task = asyncio.get_running_loop().create_task(self._close(session_id))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close(self, session_id: str) -> None:
        try:
            await self.resources.post("/close_session", {"session_id": session_id}, session_id=session_id,
                                      deadline_s=10.0, retries=1)
        except Exception:  # best effort: sessions also expire on the resource server
            pass

    async def drain(self) -> None:
        """On shutdown: finish pending session closes, then release connections."""
        if self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)
        for upstream in self.upstreams():
            if hasattr(upstream.client, "aclose"):
                await upstream.client.aclose()

    def upstreams(self) -> list[Upstream]:
        return [self.resources, self.model]


class Rollout:
    """One rollout. Not reused: all state lives on the instance."""

    def __init__(self, agent: Agent, row: dict[str, Any]) -> None:
        self.agent = agent
        self.config = agent.config
        self.row = row
        self.params: dict[str, Any] = dict(row["responses_create_params"])
        raw_input = self.params.get("input")
        self.input: list[dict[str, Any]] = (
            [{"role": "user", "content": raw_input}] if isinstance(raw_input, str) else list(raw_input or []))
        self.allowed_tools = {n for n in (tool_name(t) for t in self.params.get("tools") or [] if isinstance(t, dict))
                              if n}
        self.items: list[dict[str, Any]] = []
        self.num_turns = 0
        self.usage = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
        self.context_tokens = 0
        self.last_response: dict[str, Any] = {}
        self.stop_reason = "completed"
        self.tool_calls = 0
        self.terminated = False  # a tool replied that the episode is over
        self.session_id = uuid.uuid4().hex
        self.session_closed = False
        # the replica that holds the session (its own address, from /seed_session): the session's
        # calls go there directly; None: through the resource server's balanced address
        self.session_url: str | None = None
        self.deadline = time.monotonic() + self.config.rollout_deadline_s
        self.rollout_id: str | None = None  # set when the caller names the rollout and checkpoints are kept

    @classmethod
    def check_row(cls, row: dict[str, Any]) -> None:
        """Agent-specific row checks before anything is called (raise BadRequest)."""

    # ---- deadlines ---------------------------------------------------------- #
    def remaining(self, what: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RolloutFailure(FailureKind.TIMEOUT, f"rollout deadline of {self.config.rollout_deadline_s}s exceeded "
                                            f"before {what} ({self.num_turns} model calls done)")
        return left

    def step_deadline(self, what: str) -> float:
        return min(self.config.step_deadline_s, self.remaining(what))

    # ---- the rollout ---------------------------------------------------------- #
    async def run(self) -> dict[str, Any]:
        ended = False  # a rollout cancelled midway keeps its session and checkpoint for a retry
        try:
            progress = self.agent.checkpoints.load(self.rollout_id) if self.agent.checkpoints and self.rollout_id \
                else None
            if progress is not None:
                await self.resume(progress)
            else:
                await self.seed()
                self.save("seed")
            if not self.terminated:
                await self.converse()
            reply = await self.verify()
            ended = True
            return reply
        except RolloutFailure as exc:
            ended = True
            return self.masked(exc.kind, exc.reason)
        except GymError:
            ended = True
            raise  # a 4xx about the row itself
        except Exception as exc:  # a bug must not cost the trainer the sample's bookkeeping
            ended = True
            log.exception("rollout crashed")
            return self.masked(FailureKind.CRASH, f"agent error: {type(exc).__name__}: {exc}")
        finally:
            if ended or not self.rollout_id:
                if self.rollout_id and self.agent.checkpoints:
                    self.agent.checkpoints.drop(self.rollout_id)
                if not self.session_closed:
                    self.agent.close_later(self.session_id)

    # ---- checkpoints (a retry on another replica goes on from here) -------- #
    def save(self, step: str, items: list[dict[str, Any]] | None = None) -> None:
        if not self.rollout_id or self.agent.checkpoints is None:
            return
        last = {k: v for k, v in self.last_response.items() if k != "output"}
        state = {"num_turns": self.num_turns, "usage": self.usage, "context_tokens": self.context_tokens,
                 "tool_calls": self.tool_calls, "terminated": self.terminated, "stop_reason": self.stop_reason,
                 "last_response": last}
        self.agent.checkpoints.append(self.rollout_id, {"step": step, "session_id": self.session_id,
                                                        "session_url": self.session_url, "items": items or [],
                                                        "state": state})

    async def resume(self, progress: Progress) -> None:
        """Go on from the last completed step: the session and outputs so far as they were, then the tool
        calls of the last model output that had not answered (their sequence numbers as first sent)."""
        assert progress.session_id is not None
        self.session_id = progress.session_id
        if progress.session_url:
            self.session_url = progress.session_url
            trust(progress.session_url)
        self.items = list(progress.items)
        state = progress.state
        self.num_turns = int(state.get("num_turns", 0))
        self.usage = dict(state.get("usage") or self.usage)
        self.context_tokens = int(state.get("context_tokens", 0))
        self.tool_calls = int(state.get("tool_calls", 0))
        self.terminated = bool(state.get("terminated", False))
        self.stop_reason = str(state.get("stop_reason", self.stop_reason))
        self.last_response = dict(state.get("last_response") or {})
        log.info("rollout %s resumes after %d model calls and %d tool calls", self.rollout_id, self.num_turns,
                 self.tool_calls)
        for call in progress.pending_calls:
            if self.terminated:
                break
            self.tool_calls += 1
            item = await self.call_tool(call)
            self.items.append(item)
            self.save("tool", [item])
        if self.terminated:
            self.stop_reason = "terminated"

    async def seed(self) -> None:
        try:
            response = await self.agent.resources.post("/seed_session", self.row, session_id=self.session_id,
                                                       deadline_s=self.step_deadline("/seed_session"))
            if response.status_code == 500:
                # what Ray Serve answers for a replica that died: whatever it seeded died with it, so
                # seeding again (on another replica) is safe; a real bug answers 500 again
                response = await self.agent.resources.post("/seed_session", self.row, session_id=self.session_id,
                                                           deadline_s=self.step_deadline("/seed_session"))
        except UpstreamError as exc:
            raise RolloutFailure(exc.kind, f"/seed_session on {self.agent.resources.describe()}: {exc.message}")
        if 400 <= response.status_code < 500:
            # The resource server says the row itself is wrong for this environment.
            raise BadRequest(f"the resource server rejected the row at /seed_session "
                             f"({response.status_code}): {error_message(response)}")
        if response.status_code >= 300:
            raise RolloutFailure(FailureKind.UPSTREAM, f"/seed_session answered {response.status_code}: "
                                             f"{error_message(response)}")
        try:
            sid = response.json().get("session_id")
        except (ValueError, AttributeError):
            sid = None
        if isinstance(sid, str) and sid:
            self.session_id = sid
        self.follow(response, await self.agent.resources.base())

    def follow(self, response: Any, via: str | None = None) -> None:
        """Call the session's owner directly from now on, when a server we trust names it."""
        owner = response.headers.get(REPLICA_HEADER)
        if isinstance(owner, str) and owner.startswith(("http://", "https://")) and (
                via is None or trusted(via)):
            trust(owner)
            self.session_url = owner.rstrip("/")

    async def session_post(self, path: str, payload: Any, *, deadline_s: float, retries: int | None = None,
                           headers: dict[str, str] | None = None) -> Any:
        """A call of the session: to its owner replica directly; when that replica is gone (nothing
        answers), through the balanced address, where another replica forwards or rebuilds it."""
        started = time.monotonic()
        if self.session_url:
            try:
                response = await self.agent.client.request(
                    "POST", self.session_url + path, json=payload, session_id=self.session_id,
                    deadline_s=deadline_s, retries=0, headers=headers)
            except UpstreamError as exc:
                if exc.kind != FailureKind.UPSTREAM or exc.upstream_status is not None:
                    raise
                log.info("session %s: its replica %s is gone; calling through the balanced address",
                         self.session_id, self.session_url)
                self.session_url = None
            else:
                self.follow(response)
                return response
        response = await self.agent.resources.post(path, payload, session_id=self.session_id,
                                                   deadline_s=max(0.1, deadline_s - (time.monotonic() - started)),
                                                   retries=retries, headers=headers)
        self.follow(response)
        return response

    async def converse(self) -> None:
        """Assistant turns until the conversation ends; multi-turn agents add user turns between them."""
        while True:
            done = await self.assistant_turn()
            if done:
                return
            message = await self.next_user_message()
            if message is None:
                return
            self.items.append(user_message(message))

    async def next_user_message(self) -> str | None:
        """The next user turn after a final assistant message (None: the conversation is over)."""
        return None

    async def assistant_turn(self) -> bool:
        """Model calls and tool calls until a final assistant message; True when the rollout must stop."""
        for _ in range(self.config.max_steps):
            if self.budget_left() <= 0:
                return self.exhausted("max_total_tokens", f"token budget of {self.config.max_total_tokens}")
            output = await self.call_model()
            calls = [item for item in output if item.get("type") == "function_call"]
            if not calls:
                return False
            for call in calls:
                if self.config.max_tool_calls is not None and self.tool_calls >= self.config.max_tool_calls:
                    return self.exhausted("max_tool_calls", f"tool-call budget of {self.config.max_tool_calls}")
                self.tool_calls += 1
                item = await self.call_tool(call)
                self.items.append(item)
                self.save("tool", [item])
                if self.terminated:
                    self.stop_reason = "terminated"
                    return True
        return self.exhausted("max_steps", f"step budget of {self.config.max_steps} model calls")

    def exhausted(self, reason: str, what: str) -> bool:
        """A budget ran out: stop and score what was done, or (mask_on_budget) mask the rollout."""
        if self.config.mask_on_budget:
            raise RolloutFailure(FailureKind.TIMEOUT, f"{what} exhausted after {self.num_turns} model calls "
                                                      f"and {self.tool_calls} tool calls")
        self.stop_reason = reason
        return True

    def budget_left(self) -> float:
        if self.config.max_total_tokens is None:
            return float("inf")
        return self.config.max_total_tokens - self.context_tokens

    def model_request(self) -> dict[str, Any]:
        body = dict(self.params)
        body.pop("stream", None)
        for key in SAMPLING_DEFAULTS:
            value = getattr(self.config, key)
            if value is not None and body.get(key) is None:
                body[key] = value
        if self.config.model and not body.get("model"):
            body["model"] = self.config.model
        left = self.budget_left()
        if left != float("inf"):
            cap = max(1, int(left))
            body["max_output_tokens"] = min(body.get("max_output_tokens") or cap, cap)
        body["input"] = self.input + [_strip_training(item) for item in self.items]
        return body

    async def call_model(self) -> list[dict[str, Any]]:
        what = f"model call {self.num_turns + 1}"
        try:
            response = await self.agent.model.post("/v1/responses", self.model_request(), session_id=self.session_id,
                                                   deadline_s=self.step_deadline(what))
        except UpstreamError as exc:
            raise RolloutFailure(exc.kind, f"{what} to {self.agent.model.describe()}: {exc.message}")
        if response.status_code >= 400:
            kind = FailureKind.BAD_REQUEST if response.status_code < 500 else FailureKind.UPSTREAM
            raise RolloutFailure(kind, f"{what}: the model server answered {response.status_code}: "
                                       f"{error_message(response)}")
        try:
            reply = response.json()
        except ValueError:
            raise RolloutFailure(FailureKind.UPSTREAM, f"{what}: the model server answered invalid JSON: "
                                             f"{response.text[:200]}")
        output = reply.get("output") if isinstance(reply, dict) else None
        if not isinstance(output, list) or not all(isinstance(i, dict) for i in output):
            raise RolloutFailure(FailureKind.UPSTREAM, f"{what}: the model reply has no output list of items")
        if reply.get("context_length_exceeded") and self.num_turns == 0:
            # the row's own prompt does not fit the policy's context: nothing the policy did, so no score
            # (a later call that overflows holds the policy's own tokens: that rollout ends and is scored)
            raise RolloutFailure(FailureKind.CONTEXT_OVERFLOW, f"{what}: the prompt is longer than the model "
                                 f"server's context: {str(reply.get('upstream_error') or '')[:300]}")
        self.num_turns += 1
        self.last_response = reply
        self.items.extend(output)
        self._count_tokens(reply, output)
        self.save("model", output)
        return output

    def _count_tokens(self, reply: dict[str, Any], output: list[dict[str, Any]]) -> None:
        usage = reply.get("usage") if isinstance(reply.get("usage"), dict) else {}
        inp, out = int(usage.get("input_tokens") or 0), int(usage.get("output_tokens") or 0)
        if not inp and not out and output:
            last = output[-1]
            inp = len(last.get("prompt_token_ids") or [])
            out = len(last.get("generation_token_ids") or [])
        if not inp and not out:  # no counts at all: a rough estimate keeps the budget meaningful
            inp, out = len(json.dumps(self.input + self.items, default=str)) // 4, 0
        self.usage["input_tokens"] += inp
        self.usage["output_tokens"] += out
        self.usage["total_tokens"] += inp + out
        self.context_tokens = inp + out

    async def call_tool(self, call: dict[str, Any]) -> dict[str, Any]:
        """One function call -> its `function_call_output`. Mistakes go back to the model; outages mask."""
        name = call.get("name")
        call_id = str(call.get("call_id") or call.get("id") or f"call_{uuid.uuid4().hex[:24]}")

        def output(text: str) -> dict[str, Any]:
            return {"type": "function_call_output", "call_id": call_id, "output": text}

        if (not isinstance(name, str) or name not in self.allowed_tools or name in RESERVED_PATHS
                or not _TOOL_NAME.match(name)):
            known = ", ".join(sorted(self.allowed_tools)) or "none"
            return output(f"Error: unknown tool {name!r}. Available tools: {known}.")
        raw = call.get("arguments")
        try:
            arguments = raw if isinstance(raw, dict) else json.loads(raw or "{}")
        except (TypeError, ValueError) as exc:
            return output(f"Error: the arguments of {name} are not valid JSON ({exc}). "
                          "Call the tool again with a JSON object of arguments.")
        if not isinstance(arguments, dict):
            return output(f"Error: the arguments of {name} must be a JSON object, got {type(arguments).__name__}.")
        what = f"tool {name}"
        try:
            # Tools change state: a repeat of this call (same sequence number) is answered from the
            # session's journal, never applied twice, so a call whose replica died can be sent again.
            response = await self.session_post(f"/{name}", arguments, deadline_s=self.step_deadline(what), retries=1,
                                               headers={CALL_SEQ_HEADER: str(self.tool_calls)})
        except UpstreamError as exc:
            raise RolloutFailure(exc.kind, f"{what} on {self.agent.resources.describe()}: {exc.message}")
        if response.status_code == 409:
            raise RolloutFailure(session_failure(response), f"{what}: the resource server lost the session: "
                                                            f"{error_message(response)}")
        if response.status_code == 404:
            return output(f"Error: tool {name!r} does not exist on the resource server.")
        if 400 <= response.status_code < 500:
            return output(f"Error: {error_message(response)}")
        if response.status_code >= 300:
            raise RolloutFailure(FailureKind.UPSTREAM, f"{what} answered {response.status_code}: {error_message(response)}")
        self.terminated = is_terminal(response)
        return output(response.text)

    # ---- results ---------------------------------------------------------- #
    def response_object(self) -> dict[str, Any]:
        """The whole trajectory as one complete Responses API object (what `/verify` judges).

        Every field of the object is present (NeMo-Gym's resources servers validate them all);
        the sampling fields are the request's, as an OpenAI server reports them.
        """
        last, params = self.last_response, self.params
        completed = self.stop_reason in ("completed", "terminated")
        metadata = last.get("metadata")
        return {
            "id": last.get("id") or f"resp_{uuid.uuid4().hex[:24]}",
            "object": "response",
            "created_at": last.get("created_at") or time.time(),
            "model": last.get("model") or params.get("model") or self.config.model,
            "status": "completed" if completed else "incomplete",
            "error": None,
            "incomplete_details": None if completed else {"reason": self.stop_reason},
            "instructions": params.get("instructions"),
            "metadata": metadata if isinstance(metadata, dict) else {},
            "output": self.items,
            "parallel_tool_calls": params.get("parallel_tool_calls", True),
            "temperature": params.get("temperature"),
            "top_p": params.get("top_p"),
            "tool_choice": params.get("tool_choice") or "auto",
            "tools": params.get("tools") or [],
            "max_output_tokens": params.get("max_output_tokens"),
            "usage": {**self.usage, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}},
        }

    def extras(self) -> dict[str, Any]:
        return {"num_turns": self.num_turns, "session_id": self.session_id, "stop_reason": self.stop_reason}

    async def verify(self) -> dict[str, Any]:
        body = {**self.row, "response": self.response_object()}
        try:
            response = await self.session_post(
                "/verify", body, headers={CLOSE_SESSION_HEADER: "1"},
                deadline_s=min(self.config.verify_deadline_s, self.remaining("/verify")))
        except UpstreamError as exc:
            raise RolloutFailure(exc.kind, f"/verify on {self.agent.resources.describe()}: {exc.message}")
        # a gymserve resource server closes the session with the verify; others need /close_session
        self.session_closed = response.headers.get(CLOSE_SESSION_HEADER.lower()) == "1"
        if response.status_code == 409:
            raise RolloutFailure(session_failure(response), f"/verify: the resource server lost the session: "
                                                            f"{error_message(response)}")
        if response.status_code >= 400:
            kind = FailureKind.BAD_REQUEST if response.status_code < 500 else FailureKind.UPSTREAM
            raise RolloutFailure(kind, f"/verify answered {response.status_code}: {error_message(response)}")
        try:
            reply = response.json()
        except ValueError:
            raise RolloutFailure(FailureKind.UPSTREAM, f"/verify answered invalid JSON: {response.text[:200]}")
        if not isinstance(reply, dict) or not isinstance(reply.get("reward"), (int, float)):
            raise RolloutFailure(FailureKind.UPSTREAM, "/verify reply has no numeric reward")
        reply.update(self.extras())
        return reply

    def masked(self, kind: str, reason: str) -> dict[str, Any]:
        base = {**self.row, "response": self.response_object()}
        try:
            reply = failed_reply(base, kind, reason).dump()
        except ValueError:  # a row field that clashes with the reply's (e.g. a non-numeric "reward")
            reply = {**base, "reward": 0.0, "mask_sample": True, "failure_kind": kind,
                     "failure_reason": redact_text(reason)}
        reply.update(self.extras())
        return reply
