"""The model behind the HTTP routes: load, render the prompt, keep token continuity, generate.

One `HFModel` per server. Requests become a `Turn` (prompt text + IDs), the engine samples,
and `finish()` records the session state for the next turn's continuity.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.core.errors import BadRequest, Conflict

from .continuity import SessionTokens, TurnState, assistant_rendering, splice
from .types import Generation, SamplingParams
from .templates import ChatFormat, parse_tool_calls

log = logging.getLogger("gymserve.models")

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


@dataclass
class Turn:
    """One model call, ready to generate."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prompt_text: str
    prompt_ids: list[int]
    continuity_broken: bool | None
    max_new_tokens: int
    overflow: bool = False


@dataclass
class Choice:
    """One generated choice, parsed."""

    generation: Generation
    content: str
    calls: list[dict[str, str]]
    finish_reason: str  # stop | length | tool_calls
    extra: dict[str, Any] = field(default_factory=dict)


class HFModel:
    def __init__(self, path: str | None, *, device: str = "auto", dtype: str = "auto", max_batch_size: int = 16,
                 max_batch_tokens: int = 32768, batch_wait_s: float = 0.02, max_model_len: int | None = None,
                 session_cache_size: int = 4096, served_name: str | None = None, threads: int | None = None,
                 continuous: bool = True) -> None:
        self.path = path
        self.device_name = device
        self.dtype_name = dtype
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.batch_wait_s = batch_wait_s
        self.max_model_len_option = max_model_len
        self.sessions = SessionTokens(session_cache_size)
        self.served_name = served_name
        self.threads = threads
        self.continuous = continuous
        self.engine: Any = None  # engine.Engine once loaded
        self.tokenizer: Any = None
        self.format: ChatFormat | None = None
        self.max_model_len = 0
        self.eot_texts: list[str] = []
        # Rendering and tokenizing a long prompt takes seconds: one thread does it (a fast tokenizer
        # must not be used by two threads at once) so the event loop keeps answering /health.
        self.text_thread = ThreadPoolExecutor(1, thread_name_prefix="hf-text")

    # ------------------------------------------------------------------ loading
    def load(self) -> None:
        """Blocking: runs in a worker thread at startup."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from .embedded import embedded_model_dir
        from .engine import Engine

        if self.threads:
            torch.set_num_threads(self.threads)
        folder = Path(self.path).expanduser() if self.path else embedded_model_dir()
        if not folder.is_dir():
            raise RuntimeError(f"model folder {folder} does not exist")
        self.served_name = self.served_name or (folder.name if self.path else "SmolLM2-135M-Instruct")
        device = self._device(torch)
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
            self.dtype_name, torch.float32 if device.type == "cpu" else torch.bfloat16)
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder))
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device).eval()
        limit = getattr(model.config, "max_position_embeddings", None) or 4096
        self.max_model_len = min(self.max_model_len_option or limit, limit)
        stop_ids = self._stop_ids(model)
        self.eot_texts = [self.tokenizer.convert_ids_to_tokens(i) for i in sorted(stop_ids)]
        self.format = ChatFormat(self.tokenizer)
        self.engine = Engine(model, self.tokenizer, device=device, max_batch_size=self.max_batch_size,
                             max_batch_tokens=self.max_batch_tokens, batch_wait_s=self.batch_wait_s,
                             stop_token_ids=stop_ids, threads=self.threads, continuous=self.continuous)
        self.engine.start()
        log.warning("models/hf: %s loaded from %s on %s (%s)", self.served_name, folder, device, dtype)

    def _device(self, torch: Any) -> Any:
        if self.device_name == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device_name)

    def load_tokenizer(self, folder: str, max_model_len: int) -> None:
        """Prompt rendering and continuity without a model (the proxy's token-in mode)."""
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(Path(folder).expanduser()))
        self.max_model_len = max_model_len
        self.eot_texts = [self.tokenizer.convert_ids_to_tokens(i) for i in sorted(self._stop_ids(None))]
        self.format = ChatFormat(self.tokenizer)

    def _stop_ids(self, model: Any) -> set[int]:
        ids: set[int] = set()
        config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        for source in (config_eos, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(int(i) for i in source)
        special = set(getattr(self.tokenizer, "all_special_tokens", []) or [])
        for token in END_OF_TURN_TOKENS:
            if token in special or token in (self.tokenizer.get_added_vocab() or {}):
                tid = self.tokenizer.convert_tokens_to_ids(token)
                if isinstance(tid, int) and tid >= 0:
                    ids.add(tid)
        return ids

    def close(self) -> None:
        if self.engine is not None:
            self.engine.stop()
        self.text_thread.shutdown(wait=False, cancel_futures=True)

    async def off_loop(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` on the text thread (prompt rendering, tokenizing, `finish`)."""
        return await asyncio.get_running_loop().run_in_executor(self.text_thread, functools.partial(fn, *args, **kwargs))

    @property
    def ready(self) -> bool:
        return self.engine is not None

    @property
    def weights_version(self) -> int:
        return self.engine.weights_version if self.engine is not None else 0

    async def update_weights(self, path: str, version: int) -> int:
        """Load a trainer's safetensors file and swap it in between generations (see weights.py)."""
        import asyncio

        from .weights import check_path, check_tensors, copy_into, read_tensors

        assert self.engine is not None
        check_path(path)
        if version <= self.weights_version:
            raise Conflict(f"version: {version} is not newer than the served weights_version "
                           f"{self.weights_version}; versions only move forward")
        tensors = await asyncio.to_thread(read_tensors, path)
        check_tensors(self.engine.model, tensors)
        return await self.engine.update_weights(lambda model: copy_into(model, tensors), version)

    # ------------------------------------------------------------------ turns
    def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def prepare(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                session: str | None, max_new_tokens: int | None, default_max_tokens: int,
                training: bool) -> Turn:
        assert self.format is not None
        try:
            text = self.format.render(messages, tools)
        except Exception as exc:  # jinja raises on messages the template rejects
            raise BadRequest(f"the chat template rejected these messages: {type(exc).__name__}: {exc}") from None
        states = self.sessions.get(session) if training else None
        ids, broken = splice(text, states, self.tokenize)
        room = self.max_model_len - len(ids)
        wanted = max_new_tokens or default_max_tokens
        return Turn(messages, tools, text, ids, broken, max(0, min(wanted, room)), overflow=room <= 0)

    async def generate(self, turn: Turn, *, temperature: float | None, top_p: float | None, stop: list[str],
                       seed: int | None, n: int, top_logprobs: int = 0, on_update: Any = None) -> list[Generation]:
        assert self.engine is not None
        if turn.overflow:
            return [Generation([], [], [], "", "length", self.weights_version) for _ in range(n)]
        params = SamplingParams(temperature=1.0 if temperature is None else temperature,
                                top_p=1.0 if top_p is None else top_p, max_new_tokens=turn.max_new_tokens,
                                stop=stop, seed=seed, top_logprobs=top_logprobs)
        return await self.engine.generate(turn.prompt_ids, params, n, on_update)

    def finish(self, turn: Turn, generations: list[Generation], *, session: str | None, training: bool,
               parse_tools: bool) -> list[Choice]:
        """Parse tool calls, attach training fields, and remember the turn for the session's next call."""
        choices: list[Choice] = []
        states: list[TurnState] = []
        for gen in generations:
            content, calls = parse_tool_calls(gen.text) if parse_tools else (gen.text, [])
            finish = "tool_calls" if calls and gen.finish_reason == "stop" else gen.finish_reason
            extra: dict[str, Any] = {}
            if training:
                extra = {"prompt_token_ids": list(turn.prompt_ids), "generation_token_ids": list(gen.token_ids),
                         "generation_log_probs": list(gen.logprobs)}
                if gen.policy_version is not None:
                    extra["policy_version"] = gen.policy_version
                if turn.continuity_broken:
                    extra["token_continuity_broken"] = True
                if session and not turn.overflow:
                    states.append(self._state(turn, gen, content, calls))
            choices.append(Choice(gen, content, calls, finish, extra))
        if states:
            self.sessions.put(session, states)
        return choices

    def _state(self, turn: Turn, gen: Generation, content: str, calls: list[dict[str, str]]) -> TurnState:
        assert self.format is not None
        reply: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            reply["tool_calls"] = [{"id": "call", "type": "function",
                                    "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
        try:
            rendered = self.format.render(turn.messages + [reply], turn.tools, add_generation_prompt=False)
            assistant, eot = assistant_rendering(turn.prompt_text, rendered, self.eot_texts)
        except Exception:
            assistant, eot = None, ""
        ended = bool(gen.token_ids) and gen.finish_reason == "stop" and \
            self.tokenizer.convert_ids_to_tokens(gen.token_ids[-1]) == eot
        return TurnState.of(turn.prompt_text, turn.prompt_ids + gen.token_ids, assistant, ended, eot)


def default_threads() -> int:
    """torch CPU threads: GYMSERVE_TORCH_THREADS, else half the cores (at least 1).

    The model shares the machine with the rest of the stack; on an oversubscribed 2-core box
    two spinning OpenMP threads decode several times slower than one."""
    value = os.environ.get("GYMSERVE_TORCH_THREADS")
    return int(value) if value else max(1, (os.cpu_count() or 2) // 2)
