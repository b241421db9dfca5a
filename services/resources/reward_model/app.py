"""reward_model: scores rollouts with a Bradley-Terry reward model (HF sequence classification, one logit).

`gymserve serve resources/reward_model model_name=PATH_OR_ID [device=0,1] [precision=bfloat16] ...`

Endpoints besides the resource-server ones: `POST /score` (conversations -> scores),
`POST /get_reward` (OpenRLHF's remote reward model API) and `GET /stats` (batching).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import math
import statistics
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Literal, TypeVar

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.core.app import read_json
from services.core.errors import BadRequest, Unavailable
from services.core.failures import FailureKind
from services.core.metrics_agg import aggregate_metrics, metrics_rows
from services.core.openapi import describe
from services.core.replies import failed_reply, scored_reply
from services.core.resource import Environment, ResourceConfig, Session, create_resource_app
from services.core.schemas import VerifyReply, VerifyRequest

from .batcher import DynamicBatcher
from .formatting import Encoded, Encoder, rollout_messages, validate_conversation
from .scorer import HFScorer, ScoringError, load_tokenizer, resolve_devices
from .tiny_model import TINY_NAME, cached_tiny_reward_model
from .transforms import ScoreTransform
from .vllm_backend import VLLMScorer, vllm_available

log = logging.getLogger("gymserve.reward_model")
T = TypeVar("T")
METRIC_PREFIX = "reward_model_env/"
INLINE_TOKENIZE_MAX = 4  # requests with more conversations are tokenized on the tokenizer thread


class Config(ResourceConfig):
    model_name: str = Field(..., description="reward model: local path or hub id "
                                             "(AutoModelForSequenceClassification, num_labels=1); "
                                             "`tiny` = a small random model built offline (for trying it out)")
    tokenizer: str | None = Field(None, description="tokenizer path/id; default: the model's")
    chat_template: str | None = Field(None, description="override the tokenizer's chat template (jinja)")
    precision: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="auto = bfloat16 on GPU, float32 on CPU")
    batch_size: int = Field(32, gt=0, description="most sequences in one forward pass")
    max_tokens_per_batch: int = Field(16384, gt=0, description="token budget of a batch (rows x longest, padding included)")
    max_wait_ms: float = Field(5.0, ge=0, description="longest wait for more requests before a partial batch runs")
    max_model_len: int | None = Field(None, gt=0, description="longer conversations are truncated and flagged; "
                                                                 "default: the model's max positions")
    truncation_side: Literal["left", "right"] = Field("left", description="left keeps the response end (and BOS)")
    padding_side: Literal["auto", "left", "right"] = Field("auto", description="auto = the tokenizer's")
    device: str | None = Field(None, description="cpu, cuda, or GPU ids like 0,1 (HF: one replica per GPU; "
                                                 "vLLM: tensor parallel over them); default cuda if available else cpu")
    score_transform: Literal["raw", "sigmoid", "normalize"] = Field(
        "raw", description="raw logit, its sigmoid, or a running z-score")
    backend: Literal["hf", "vllm"] = Field("hf", description="hf (transformers) or vllm (pooling runner, GPU)")
    tensor_parallel_size: int | None = Field(None, gt=0, description="vLLM only; default: number of GPUs in device")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="vLLM only")
    enforce_eager: bool = Field(False, description="vLLM only: no CUDA graphs")
    trust_remote_code: bool = False
    use_pool: bool = Field(False, description="unused: scoring runs on the model's inference threads")

    @field_validator("device", mode="before")
    @classmethod
    def _device(cls, value: object) -> str | None:
        if value is None:
            return None
        if isinstance(value, (list, tuple)):  # device=[0,1] on the command line, or a YAML list
            value = ",".join(str(v) for v in value)
        value = str(value).strip()  # device=0 arrives as the number 0
        if value in ("", "auto", "cpu", "cuda"):
            return value or None
        parts = [p.strip().removeprefix("cuda:") for p in value.split(",")]
        if not all(p.isdigit() for p in parts):
            raise ValueError(f"device={value!r}: expected cpu, cuda, or GPU ids such as 0 or 0,1")
        return ",".join(parts)

    @model_validator(mode="after")
    def _backend_available(self) -> "Config":
        if self.backend == "vllm" and not vllm_available():
            raise ValueError("backend=vllm but vLLM is not installed (pip install vllm on a GPU machine); "
                             "use backend=hf")
        if self.backend == "vllm" and self.device == "cpu":
            raise ValueError("backend=vllm needs GPUs: set device to GPU ids (e.g. 0,1) or use backend=hf")
        return self


class RewardModelReply(VerifyReply):
    reward_model_score: float | None = Field(None, description="the raw score before score_transform")
    truncated: bool | None = Field(None, description="the conversation was cut to max_model_len")
    num_tokens: int | None = None


class ScoreRequest(BaseModel):
    conversations: list[list[dict[str, Any]]] = Field(description="conversations of {role, content} messages")


class ScoreReply(BaseModel):
    model_config = ConfigDict(extra="allow")

    scores: list[float]
    truncated: list[bool]
    num_tokens: list[int]
    raw_scores: list[float] | None = None


class OpenRLHFRewardRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    query: list[str] | str = Field(description="formatted prompt + response texts")
    prompts: list[Any] | None = None
    labels: list[Any] | None = None


class OpenRLHFRewardReply(BaseModel):
    rewards: list[float]
    scores: list[float]
    extra_logs: dict[str, Any]


class RewardModel(Environment):
    config_model = Config
    reply_model = RewardModelReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "Write a haiku."}]}}
    example_answer = "Waves fold into foam"
    description = "Reward = the single logit of a sequence-classification reward model on the conversation."

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.config: Config = config
        self.encoder: Encoder | None = None
        self.scorers: list[Any] = []
        self.batcher: DynamicBatcher | None = None
        self.transform = ScoreTransform(config.score_transform)
        self._tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="reward-model-tokenize")

    # ---- lifecycle --------------------------------------------------- #
    async def startup(self) -> None:
        try:
            await asyncio.to_thread(self._load)  # the model loads off the event loop
        except Exception as exc:
            raise RuntimeError(f"reward_model: cannot load model_name={self.config.model_name}: "
                               f"{type(exc).__name__}: {exc}") from exc
        cfg = self.config
        self.batcher = DynamicBatcher([s.score for s in self.scorers], max_batch_size=cfg.batch_size,
                                      max_tokens_per_batch=cfg.max_tokens_per_batch,
                                      max_wait_s=cfg.max_wait_ms / 1000.0, name=cfg.name).start()

    def _load(self) -> None:
        cfg = self.config
        if cfg.model_name == TINY_NAME:
            cfg.model_name = str(cached_tiny_reward_model())
        devices = resolve_devices(cfg.device)
        tokenizer = load_tokenizer(cfg.tokenizer or cfg.model_name, trust_remote_code=cfg.trust_remote_code)
        max_len = cfg.max_model_len or _model_max_len(cfg.model_name, tokenizer, cfg.trust_remote_code)
        self.encoder = Encoder(tokenizer, max_model_len=max_len, truncation_side=cfg.truncation_side,
                               chat_template=cfg.chat_template)
        if cfg.backend == "vllm":
            self.scorers = [VLLMScorer(model_name=cfg.model_name, tokenizer=cfg.tokenizer, devices=devices,
                                       precision=cfg.precision, max_model_len=max_len,
                                       tensor_parallel_size=cfg.tensor_parallel_size,
                                       gpu_memory_utilization=cfg.gpu_memory_utilization,
                                       trust_remote_code=cfg.trust_remote_code, enforce_eager=cfg.enforce_eager)]
        else:
            side = cfg.padding_side if cfg.padding_side != "auto" else (tokenizer.padding_side or "right")
            self.scorers = [HFScorer.load(cfg.model_name, device, precision=cfg.precision,
                                          pad_id=tokenizer.pad_token_id, padding_side=side,
                                          trust_remote_code=cfg.trust_remote_code) for device in devices]
        log.info("reward model %s loaded on %s (backend %s, max_model_len %d)", cfg.model_name,
                 ", ".join(str(s.device) for s in self.scorers), cfg.backend, max_len)

    def ready(self) -> bool:
        return self.batcher is not None

    async def shutdown(self) -> None:
        batcher, self.batcher = self.batcher, None
        if batcher:
            await batcher.close()
        for scorer in self.scorers:
            scorer.close()
        freed = len(self.scorers)
        self.scorers = []
        gc.collect()
        self._tokenize_pool.shutdown(wait=False, cancel_futures=True)
        if freed:
            log.info("reward model %s unloaded (%d replica(s) freed)", self.config.model_name, freed)
        await super().shutdown()

    # ---- scoring ----------------------------------------------------- #
    async def _tokenize(self, fn: Callable[[], T], count: int) -> T:
        """Tokenize `count` texts: inline when few (a thread hop costs more than ~0.25 ms of work per
        conversation), on the tokenizer thread when many, so a large request never stalls the loop."""
        if count <= INLINE_TOKENIZE_MAX:
            return fn()
        return await asyncio.get_running_loop().run_in_executor(self._tokenize_pool, fn)

    async def score_each(self, encoded: list[Encoded]) -> list[float | ScoringError]:
        """Raw score or the failure of each sequence, in order (a failed batch fails only its own items)."""
        if self.batcher is None:
            raise Unavailable("the reward model is not loaded")
        if not encoded:
            return []
        out: list[float | ScoringError] = []
        for i, result in enumerate(await self.batcher.submit([e.ids for e in encoded])):
            if isinstance(result, ScoringError):
                out.append(result)
            elif isinstance(result, BaseException):
                out.append(ScoringError(f"reward model inference failed: {type(result).__name__}: {result}"))
            elif not math.isfinite(result):
                out.append(ScoringError(f"the reward model produced a non-finite score ({result}) for sequence {i}"))
            else:
                out.append(float(result))
        return out

    async def score_encoded(self, encoded: list[Encoded]) -> tuple[list[float], list[float]]:
        """(raw scores, transformed scores) in order; any failed sequence raises its ScoringError."""
        results = await self.score_each(encoded)
        for result in results:
            if isinstance(result, ScoringError):
                raise result
        raw = [float(r) for r in results]  # type: ignore[arg-type]
        return raw, self.transform(raw)

    def _encoder(self) -> Encoder:
        if self.encoder is None:
            raise Unavailable("the reward model is not loaded")
        return self.encoder

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        messages = rollout_messages(request)
        encoder = self._encoder()
        encoded = await self._tokenize(lambda: encoder.encode_conversation(messages), 1)
        try:
            raw, reward = await self.score_encoded([encoded])
        except ScoringError as exc:
            return failed_reply(request, exc.kind, exc.message, truncated=encoded.truncated)
        return _reply(request, raw[0], reward[0], encoded)

    async def verify_many(self, requests: list[VerifyRequest]) -> list[VerifyReply]:
        """One tokenization hop and one batcher submission for the whole batch; items fail on their own."""
        encoder = self._encoder()

        def encode_all() -> list[Encoded | BadRequest]:
            out: list[Encoded | BadRequest] = []
            for request in requests:
                try:
                    out.append(encoder.encode_conversation(rollout_messages(request)))
                except BadRequest as exc:
                    out.append(exc)
            return out

        encoded = await self._tokenize(encode_all, len(requests))
        good = [e for e in encoded if isinstance(e, Encoded)]
        results = iter(await self.score_each(good))
        outcome = [next(results) if isinstance(e, Encoded) else e for e in encoded]
        scored = [r for r in outcome if isinstance(r, float)]
        transformed = iter(self.transform(scored))
        replies = []
        for request, enc, result in zip(requests, encoded, outcome):
            if isinstance(enc, BadRequest):
                replies.append(failed_reply(request, FailureKind.BAD_REQUEST, enc.message))
            elif isinstance(result, ScoringError):
                replies.append(failed_reply(request, result.kind, result.message, truncated=enc.truncated))
            else:
                replies.append(_reply(request, result, next(transformed), enc))
        return replies

    def aggregate(self, body: Any) -> dict[str, Any]:
        """The shared statistics plus NeMo RL's `reward_model_env/*` keys (over unmasked rewards)."""
        out = aggregate_metrics(body)
        rows, _ = metrics_rows(body)
        rewards = [float(r.get("reward", 0.0)) for r in rows if isinstance(r, dict) and not r.get("mask_sample")]
        out.update({
            f"{METRIC_PREFIX}num_samples": len(rows),
            f"{METRIC_PREFIX}mean_reward": statistics.fmean(rewards) if rewards else 0.0,
            f"{METRIC_PREFIX}std_reward": statistics.stdev(rewards) if len(rewards) > 1 else 0.0,
            f"{METRIC_PREFIX}min_reward": min(rewards) if rewards else 0.0,
            f"{METRIC_PREFIX}max_reward": max(rewards) if rewards else 0.0,
        })
        return out

    def stats(self) -> dict[str, Any]:
        batcher = self.batcher
        s = batcher.stats if batcher else None
        return {
            "model_name": self.config.model_name, "backend": self.config.backend,
            "devices": [str(x.device) for x in self.scorers],
            "max_model_len": self.encoder.max_model_len if self.encoder else None,
            "batches": s.batches if s else 0, "sequences": s.sequences if s else 0,
            "mean_batch_size": (s.sequences / s.batches) if s and s.batches else 0.0,
            "padding_fraction": s.padding_fraction if s else 0.0,
            "busy_s": s.busy_s if s else 0.0,
            "oom_splits": sum(getattr(x, "oom_splits", 0) for x in self.scorers),
            "score_transform": {"name": self.transform.name, **self.transform.state()},
        }


def _reply(request: VerifyRequest, raw: float, reward: float, encoded: Encoded) -> VerifyReply:
    return scored_reply(request, reward, reward_model_score=raw, truncated=encoded.truncated,
                        num_tokens=encoded.num_tokens)


def _model_max_len(model_name: str, tokenizer: Any, trust_remote_code: bool) -> int:
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(model_name, trust_remote_code=trust_remote_code)
        text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        for attr in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(text_cfg, attr, None)
            if isinstance(value, int) and value > 0:
                return value
    except (OSError, ValueError):
        pass
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < 10_000_000 else 4096


def _conversations(body: Any, limit: int) -> list[Any]:
    if not isinstance(body, dict) or "conversations" not in body:
        raise BadRequest('body: expected {"conversations": [[{"role": ..., "content": ...}, ...], ...]}')
    conversations = body["conversations"]
    if not isinstance(conversations, list):
        raise BadRequest(f"conversations: expected a list of conversations, got {type(conversations).__name__}")
    if len(conversations) > limit:
        raise BadRequest(f"conversations: {len(conversations)} exceeds max_batch_items={limit}")
    return [validate_conversation(c, f"conversations[{i}]") for i, c in enumerate(conversations)]


def _queries(body: Any, limit: int) -> list[str]:
    if not isinstance(body, dict) or "query" not in body:
        raise BadRequest('body: expected {"query": [formatted prompt+response text, ...]}')
    queries = body["query"]
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
        raise BadRequest("query: expected a list of strings")
    if len(queries) > limit:
        raise BadRequest(f"query: {len(queries)} exceeds max_batch_items={limit}")
    for key in ("prompts", "labels"):
        if body.get(key) is not None and not isinstance(body[key], list):
            raise BadRequest(f"{key}: expected a list")
    return queries


def build(config: Config) -> FastAPI:
    env = RewardModel(config)
    app = create_resource_app(env)

    @app.post("/score", **describe(body=ScoreRequest, reply=ScoreReply, errors=(503,)))
    async def score(request: Request) -> dict[str, Any]:
        """{"conversations": [[{role, content}, ...], ...]} -> {"scores": [...]} in order."""
        conversations = _conversations(await read_json(request), config.max_batch_items)
        encoder = env._encoder()
        encoded = await env._tokenize(
            lambda: [encoder.encode_conversation(c, f"conversations[{i}]") for i, c in enumerate(conversations)],
            len(conversations))
        raw, scores = await env.score_encoded(encoded)
        reply: dict[str, Any] = {"scores": scores, "truncated": [e.truncated for e in encoded],
                                 "num_tokens": [e.num_tokens for e in encoded]}
        if config.score_transform != "raw":
            reply["raw_scores"] = raw
        return reply

    @app.post("/get_reward", **describe(body=OpenRLHFRewardRequest, reply=OpenRLHFRewardReply, errors=(503,)))
    async def get_reward(request: Request) -> dict[str, Any]:
        """OpenRLHF remote reward model: {"query": [text], "prompts"?, "labels"?} -> {rewards, scores, extra_logs}."""
        queries = _queries(await read_json(request), config.max_batch_items)
        encoder = env._encoder()
        encoded = await env._tokenize(
            lambda: [encoder.encode_query(q, f"query[{i}]") for i, q in enumerate(queries)], len(queries))
        raw, rewards = await env.score_encoded(encoded)
        return {"rewards": rewards, "scores": rewards,
                "extra_logs": {"reward_model_score": raw, "truncated": [float(e.truncated) for e in encoded]}}

    @app.get("/stats", **describe(reply={"type": "object"}))
    async def stats() -> dict[str, Any]:
        return env.stats()

    return app
