"""simple_agent: one rollout = seed a session, model calls and tool calls until a final answer, verify.

NeMo-Gym's simple agent, with deadlines per step and per rollout and masked (never
fabricated) replies on infrastructure failures. The loop lives in `services/agents/loop.py`.
"""
from __future__ import annotations

from fastapi import FastAPI

from services.agents.loop import Agent, AgentConfig, Rollout
from services.agents.server import create_agent_app


class Config(AgentConfig):
    """resources_server / model_server (instance names), resources_url / model_url, max_steps,
    max_total_tokens, max_tool_calls, mask_on_budget, step/rollout/verify deadlines, default
    sampling parameters."""


class SimpleAgent(Agent):
    rollout_class = Rollout


def build(config: Config) -> FastAPI:
    return create_agent_app(SimpleAgent(config), description=__doc__ or "")
