"""OpenEnv's protocol (as `openenv` 0.10.0 defines it) on every resource server, under `/openenv`.

`GET /openenv/{health,metadata,schema,state}`, `POST /openenv/{reset,step}` and the WebSocket
`/openenv/ws` of OpenEnv's simulation mode, so OpenEnv's clients (`GenericEnvClient(base_url=
"<server>/openenv", headers={"Authorization": "Bearer <key>"})`) and `openenv validate` work
against any gymserve environment. The mapping:

- `reset(row=<dataset row>)` opens a gymserve session seeded with the row; the observation carries
  the prompt, the input messages and the tools.
- `step({"tool": NAME, "arguments": {...}})` calls a tool on that session; the observation carries
  its JSON reply (or the 4xx error the policy caused, as the HTTP tool route would answer it).
- `step({"text": answer})` ends the episode: `done: true` and the reward `/verify` gives the same
  rollout; the verify reply (reward components, judge details, and for a masked rollout
  `mask_sample`/`failure_kind`/`failure_reason`, whose reward is then None, never 0) is the metadata.

A WebSocket is one episode at a time, on one session; sessions count against `max_sessions` and
expire after `session_ttl_s` idle like any other. The HTTP `reset`/`step` are stateless, as in
OpenEnv: `step` over HTTP needs the row beside the action (`{"action": ..., "row": ...}`) and runs
a one-step episode. The auth, body limits and JSON depth limit of the server apply to every frame.
"""
from __future__ import annotations

import asyncio
import json
import logging
from importlib import metadata
from typing import Any

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..config import describe_validation_error
from ..errors import BadRequest, GymError, TooManyRequests, error_body
from ..middleware.input_guard import json_depth_exceeds
from ..resource import Environment
from .episode import Count, Episode, episode_reward, prompt_text, reply_metadata
from .mcp import jsonrpc_reply

PREFIX = "/openenv"
log = logging.getLogger("gymserve.openenv")


def _gymserve_version() -> str:
    try:
        return metadata.version("gymserve")
    except metadata.PackageNotFoundError:
        return "0.0.0"


__version__ = _gymserve_version()


class GymAction(BaseModel):
    """One OpenEnv action: a tool call (`tool` + `arguments`) or the final answer (`text`)."""

    model_config = ConfigDict(extra="forbid")

    tool: str | None = Field(None, description="name of the tool to call on the episode's session")
    arguments: dict[str, Any] = Field(default_factory=dict, description="the tool call's arguments")
    text: str | None = Field(None, description="the assistant's final answer: ends the episode with its reward")
    metadata: dict[str, Any] = Field(default_factory=dict, description="additional metadata for the action")

    @model_validator(mode="after")
    def _one(self) -> "GymAction":
        if (self.tool is None) == (self.text is None):
            raise ValueError("an action is either a tool call ({tool, arguments}) or the final answer ({text})")
        return self


class GymObservation(BaseModel):
    """What an episode shows after reset or a step."""

    model_config = ConfigDict(extra="forbid")

    done: bool = Field(False, description="whether the episode has terminated")
    reward: float | None = Field(None, description="the episode's reward (/verify's) once done; None when masked")
    metadata: dict[str, Any] = Field(default_factory=dict, description="the verify reply once done")
    prompt: str | None = Field(None, description="reset: the row's user text")
    input: list[Any] | None = Field(None, description="reset: the row's input messages")
    tools: list[dict[str, Any]] | None = Field(None, description="reset: the environment's tools")
    tool: str | None = Field(None, description="step: the tool that was called")
    output: Any = Field(None, description="step: the tool's JSON reply")
    error: str | None = Field(None, description="step: why the tool call was refused (the policy may retry)")


class GymState(BaseModel):
    model_config = ConfigDict(extra="allow")

    episode_id: str | None = Field(None, description="the episode's gymserve session id")
    step_count: int = Field(0, ge=0, description="steps taken in the current episode")
    done: bool = False


def observation(**fields: Any) -> dict[str, Any]:
    """OpenEnv's serialized observation: `{observation, reward, done, metadata?}` (metadata also inside)."""
    obs = GymObservation(**fields).model_dump()
    reward, done = obs.pop("reward"), obs.pop("done")
    out = {"observation": obs, "reward": reward, "done": done}
    if obs["metadata"]:
        out["metadata"] = obs["metadata"]
    return out


class OpenEnvSession:
    """The OpenEnv face of one `Episode`."""

    def __init__(self, env: Environment, count: Count) -> None:
        self.env = env
        self.episode = Episode(env, count)

    async def reset(self, data: dict[str, Any]) -> dict[str, Any]:
        if "row" not in data:
            raise BadRequest("row: reset needs the dataset row (reset(row={...}))")
        row = data["row"]
        await self.episode.start(row)
        return observation(prompt=prompt_text(row), input=(row.get("responses_create_params") or {}).get("input"),
                           tools=self.env.describe_tools(), metadata={"episode_id": self.episode.session.id
                                                                   if self.episode.session else None})

    async def step(self, data: dict[str, Any]) -> dict[str, Any]:
        try:
            action = GymAction.model_validate(data)
        except ValidationError as exc:
            raise BadRequest(f"action: {describe_validation_error(exc)}") from None
        if action.text is not None:
            row = self.episode.row
            reply = await self.episode.finish(action.text)
            return observation(done=True, reward=episode_reward(reply), metadata=reply_metadata(reply, row))
        try:
            output = await self.episode.call(action.tool, action.arguments)
        except GymError as exc:
            if exc.status_code >= 500 or isinstance(exc, TooManyRequests) or exc.status_code == 409:
                raise  # not the policy's doing: the caller sees an error, never a fabricated observation
            return observation(tool=action.tool, error=exc.message)
        return observation(tool=action.tool, output=output)

    def state(self) -> dict[str, Any]:
        sess = self.episode.session
        return GymState(episode_id=sess.id if sess else None, step_count=self.episode.steps,
                        done=self.episode.done).model_dump()


def _error_frame(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, GymError):
        code = ("CAPACITY_REACHED" if isinstance(exc, TooManyRequests) else
                "VALIDATION_ERROR" if exc.status_code < 500 else "EXECUTION_ERROR")
        return {"type": "error", "data": {"message": exc.message, "code": code, "status": exc.status_code,
                                          "error_type": exc.error_type}}
    return {"type": "error", "data": {"message": f"internal error: {type(exc).__name__}", "code": "EXECUTION_ERROR",
                                      "status": 500}}


def build_openenv_app(env: Environment, count: Count) -> FastAPI:
    """The `/openenv` sub-application (its own OpenAPI document, as `openenv validate` reads it)."""
    config = env.config
    app = FastAPI(title=f"gymserve {config.kind or 'environment'} {config.name}: OpenEnv binding",
                  version=__version__, docs_url=None, redoc_url=None)

    @app.exception_handler(GymError)
    async def _gym_error(request: Request, exc: GymError) -> JSONResponse:
        return JSONResponse(error_body(exc.message, exc.error_type), status_code=exc.status_code)

    @app.get("/health", summary="Health check")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/metadata", summary="Get environment metadata")
    async def metadata() -> dict[str, Any]:
        return {"name": config.name, "description": env.description or f"gymserve environment {config.kind}",
                "version": __version__, "author": None, "documentation_url": None, "readme_content": None}

    @app.get("/schema", summary="Get all JSON schemas")
    async def schema() -> dict[str, Any]:
        return {"action": GymAction.model_json_schema(), "observation": GymObservation.model_json_schema(),
                "reset_observation": GymObservation.model_json_schema(), "state": GymState.model_json_schema()}

    @app.get("/state", summary="Get current environment state")
    async def state() -> dict[str, Any]:
        return GymState().model_dump()  # HTTP is stateless, as in OpenEnv: a fresh environment's state

    async def _json(request: Request) -> dict[str, Any]:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            raise BadRequest(f"malformed JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("body: expected a JSON object")
        return body

    @app.post("/reset", summary="Reset the environment (stateless: the episode is closed again)")
    async def reset(request: Request) -> dict[str, Any]:
        session = OpenEnvSession(env, count)
        try:
            return await session.reset(await _json(request))
        finally:
            await session.episode.close()

    @app.post("/step", summary="One-step episode: {action, row}")
    async def step(request: Request) -> dict[str, Any]:
        body = await _json(request)
        if not isinstance(body.get("action"), dict):
            raise BadRequest("action: expected the action as a JSON object")
        if "row" not in body:
            raise BadRequest("row: HTTP /step is stateless; send the dataset row beside the action, or use the "
                             "WebSocket /ws for an episode of many steps")
        session = OpenEnvSession(env, count)
        try:
            await session.reset({"row": body["row"]})
            return await session.step(body["action"])
        finally:
            await session.episode.close()

    @app.post("/mcp", summary="MCP JSON-RPC (stateless: tools/list)")
    async def mcp(request: Request) -> dict[str, Any]:
        raw = await request.body()
        return await jsonrpc_reply(env, raw, None)

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        session = OpenEnvSession(env, count)
        try:
            while True:
                try:
                    raw = await asyncio.wait_for(websocket.receive_text(), timeout=config.session_ttl_s)
                except asyncio.TimeoutError:
                    break  # an idle connection holds no session longer than an idle HTTP caller
                reply = await _frame(session, raw)
                if reply is None:
                    break
                await websocket.send_text(json.dumps(reply, separators=(",", ":"), ensure_ascii=False))
        except WebSocketDisconnect:
            pass
        finally:
            await session.episode.close()
            try:
                await websocket.close()
            except RuntimeError:
                pass

    async def _frame(session: OpenEnvSession, raw: str) -> dict[str, Any] | None:
        data = raw.encode("utf-8", "surrogatepass")
        if len(data) > config.max_body_bytes:
            return _error_frame(BadRequest(f"message: {len(data)} bytes exceeds max_body_bytes={config.max_body_bytes}"))
        if json_depth_exceeds(data, config.max_json_depth):
            return _error_frame(BadRequest(f"message: JSON nested deeper than max_json_depth={config.max_json_depth}"))
        try:
            message = json.loads(raw)
        except ValueError as exc:
            return {"type": "error", "data": {"message": f"Invalid JSON: {exc}", "code": "INVALID_JSON"}}
        if not isinstance(message, dict):
            return {"type": "error", "data": {"message": "message: expected a JSON object", "code": "VALIDATION_ERROR"}}
        kind, payload = message.get("type"), message.get("data") or {}
        try:
            if not isinstance(payload, dict):
                raise BadRequest("data: expected a JSON object")
            if kind == "reset":
                return {"type": "observation", "data": await session.reset(payload)}
            if kind == "step":
                return {"type": "observation", "data": await session.step(payload)}
            if kind == "state":
                return {"type": "state", "data": session.state()}
            if kind == "close":
                return None
            if kind == "mcp":
                sess = session.episode.session
                return {"type": "mcp", "data": await jsonrpc_reply(env, json.dumps(payload).encode(), sess)}
            return {"type": "error", "data": {"message": f"Unknown message type: {kind}", "code": "UNKNOWN_TYPE"}}
        except Exception as exc:  # one bad frame fails alone; the connection stays usable
            if not isinstance(exc, GymError):
                log.exception("OpenEnv %s frame failed", kind)
            return _error_frame(exc)

    return app
