"""multi_turn_agent: simple_agent plus follow-up user turns, for multi-turn tasks.

After each final assistant message the next user turn comes from the row's scripted
`user_turns` (a list of strings, used in order) or, when the row has none, from a user
simulator: another model server (`user_model_server`) prompted with `user_prompt` (or the
row's `user_model_system_prompt`) that sees the conversation with roles swapped. The
simulator ends the conversation by saying `end_token`. At most `max_user_turns` follow-ups;
`max_steps` applies to each assistant turn, `max_total_tokens` to the whole conversation.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import Field, model_validator

from services.agents.loop import Agent, AgentConfig, Rollout, RolloutFailure, Upstream, error_message, message_text
from services.agents.server import create_agent_app
from services.core.errors import BadRequest, UpstreamError
from services.core.failures import FailureKind

DEFAULT_USER_PROMPT = (
    "You are the user of an AI assistant, not the assistant. Stay in character: reply to the assistant's last "
    "message in one or two short sentences, using only what you know from the conversation. When your request "
    "has been completed, reply with exactly END_CONVERSATION.")


class Config(AgentConfig):
    user_model_server: str | None = Field(None, description="user simulator model server (instance name)")
    user_model_url: str | None = Field(None, description="explicit user simulator URL (overrides the name)")
    user_prompt: str = Field(DEFAULT_USER_PROMPT, description="system prompt of the user simulator")
    max_user_turns: int = Field(3, ge=0, description="most follow-up user turns")
    end_token: str = Field("END_CONVERSATION", min_length=1, description="the simulator says this to stop")
    user_max_output_tokens: int | None = Field(256, gt=0, description="length limit of a simulated turn")
    user_temperature: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_simulator(self) -> "Config":
        if self.user_model_server and self.user_model_url:
            raise ValueError("set user_model_server or user_model_url, not both")
        return self


class MultiTurnRollout(Rollout):
    config: Config

    @classmethod
    def check_row(cls, row: dict[str, Any]) -> None:
        turns = row.get("user_turns")
        if turns is not None and (not isinstance(turns, list) or not all(isinstance(t, str) for t in turns)):
            raise BadRequest("user_turns: expected a list of strings (the scripted follow-up user turns)")
        prompt = row.get("user_model_system_prompt", row.get("user_prompt"))
        if prompt is not None and not isinstance(prompt, str):
            raise BadRequest("user_model_system_prompt: expected a string")

    def __init__(self, agent: "MultiTurnAgent", row: dict[str, Any]) -> None:
        super().__init__(agent, row)
        self.user_upstream = agent.user_model
        self.num_user_turns = 0

    async def next_user_message(self) -> str | None:
        if self.num_user_turns >= self.config.max_user_turns:
            return None
        scripted = self.row.get("user_turns")
        if scripted is not None:
            text = scripted[self.num_user_turns] if self.num_user_turns < len(scripted) else None
        elif self.user_upstream is not None:
            text = await self.simulate()
        else:
            text = None
        if not text:
            return None
        self.num_user_turns += 1
        return text

    def swapped_conversation(self) -> list[dict[str, Any]]:
        """The conversation from the user's side: our user turns are its assistant turns and vice versa."""
        swap = {"user": "assistant", "assistant": "user"}
        messages = []
        for item in self.input + self.items:
            role = item.get("role")
            if item.get("type", "message") != "message" or role not in swap:
                continue  # system prompt, tool calls and tool outputs are the assistant's business
            text = message_text(item)
            if text:
                messages.append({"role": swap[role], "content": text})
        return messages

    async def simulate(self) -> str | None:
        prompt = self.row.get("user_model_system_prompt") or self.row.get("user_prompt") or self.config.user_prompt
        body: dict[str, Any] = {"input": [{"role": "system", "content": prompt}, *self.swapped_conversation()]}
        if self.config.user_max_output_tokens:
            body["max_output_tokens"] = self.config.user_max_output_tokens
        if self.config.user_temperature is not None:
            body["temperature"] = self.config.user_temperature
        if self.config.model:
            body["model"] = self.config.model
        what = f"user simulator turn {self.num_user_turns + 1}"
        try:
            # its own session: the policy's token continuity must not see the simulator's tokens
            response = await self.user_upstream.post("/v1/responses", body, session_id=f"{self.session_id}-user",
                                                     deadline_s=self.step_deadline(what))
        except UpstreamError as exc:
            raise RolloutFailure(exc.kind, f"{what} on {self.user_upstream.describe()}: {exc.message}")
        if response.status_code >= 400:
            raise RolloutFailure(FailureKind.BAD_REQUEST if response.status_code < 500 else FailureKind.UPSTREAM,
                                 f"{what}: answered {response.status_code}: {error_message(response)}")
        try:
            output = response.json().get("output") or []
        except (ValueError, AttributeError):
            raise RolloutFailure(FailureKind.UPSTREAM, f"{what}: invalid JSON reply")
        text = "".join(message_text(i) for i in output
                       if isinstance(i, dict) and i.get("type") == "message").strip()
        if self.config.end_token in text:
            return None
        return text or None

    def extras(self) -> dict[str, Any]:
        return {**super().extras(), "num_user_turns": self.num_user_turns}


class MultiTurnAgent(Agent):
    rollout_class = MultiTurnRollout

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.user_model: Upstream | None = None
        if config.user_model_server or config.user_model_url:
            self.user_model = Upstream("user simulator", config.user_model_server, config.user_model_url,
                                       self.directory, self.client)


    def upstreams(self) -> list[Upstream]:
        return super().upstreams() + ([self.user_model] if self.user_model else [])


def build(config: Config) -> FastAPI:
    return create_agent_app(MultiTurnAgent(config), description=__doc__ or "")
