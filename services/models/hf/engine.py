"""Batched generation engine: one dedicated thread runs every forward pass.

Requests queue up while a batch runs; the thread then takes as many rows as fit
(`max_batch_size`, `n` counts as n rows), left-pads them, and decodes them together
with a KV cache. Each row keeps its own sampling settings and its own seeded
generator, so a seeded request samples the same tokens whatever else is in the batch
(up to the float noise that left padding adds). torch releases the GIL during the
forward passes, so the event loop stays responsive.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .types import Generation, SamplingParams

log = logging.getLogger("gymserve.models")

GREEDY_BELOW = 1e-5  # temperatures below this decode greedily
MAX_TOP_LOGPROBS = 20


TokenCallback = Callable[[int, str, bool], None]  # (choice index, text so far, finished)


@dataclass
class _Job:
    prompt_ids: list[int]
    params: SamplingParams
    n: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    on_update: TokenCallback | None = None
    results: list[Generation | None] = field(default_factory=list)


@dataclass
class _Row:
    job: _Job
    index: int
    generator: torch.Generator
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    text: str = ""
    done: bool = False
    finish: str = "length"


class Engine:
    """Owns the model; `await generate(...)` from any coroutine."""

    def __init__(self, model: Any, tokenizer: Any, *, device: torch.device, max_batch_size: int = 16,
                 max_batch_tokens: int = 32768, batch_wait_s: float = 0.02,
                 stop_token_ids: set[int] | None = None, threads: int | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.threads = threads
        self.max_batch_tokens = max_batch_tokens  # padded prompt tokens per batch: one long prompt is not copied 16x
        self.stop_token_ids = set(stop_token_ids or ())
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (next(iter(self.stop_token_ids)) if self.stop_token_ids else 0)
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.batches = 0
        self.rows = 0
        self.tokens = 0
        self.weights_version = 0  # advanced by update_weights; every Generation carries the one it used
        self._inflight = 0  # generate() calls between the weights gate and their result
        self._gate: asyncio.Event | None = None  # cleared while weights are being swapped
        self._drained: asyncio.Event | None = None  # set when no generation is in flight
        self._update_lock: asyncio.Lock | None = None

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gymserve-generate", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    async def generate(self, prompt_ids: list[int], params: SamplingParams, n: int = 1,
                       on_update: TokenCallback | None = None) -> list[Generation]:
        await self._wait_for_weights()
        version = self.weights_version
        self._inflight += 1
        try:
            loop = asyncio.get_running_loop()
            job = _Job(list(prompt_ids), params, n, loop, loop.create_future(), on_update, [None] * n)
            self._queue.put(job)
            generations = await job.future
        finally:
            self._inflight -= 1
            if self._inflight == 0 and self._drained is not None:
                self._drained.set()
        for generation in generations:
            generation.policy_version = version
        return generations

    # ------------------------------------------------------------------ weights
    async def update_weights(self, apply: Callable[[Any], None], version: int | None = None) -> int:
        """Swap the model's weights between generations; returns the new `weights_version`.

        Semantics (kept by any batching strategy, since it only gates `generate`):
        1. new `generate` calls wait at the gate;
        2. generations already in flight finish on the old weights (their replies carry the old version);
        3. `apply(model)` runs in a worker thread while nothing is generating (it copies tensors in place);
        4. `weights_version` becomes `version` (default: +1) and the gate opens.
        Concurrent updates run one after another. If `apply` raises, the old version stays and the
        gate reopens (the weights may be partly written: callers validate before applying).
        Must be awaited on the event loop that calls `generate`.
        """
        if self._update_lock is None:
            self._update_lock = asyncio.Lock()
        async with self._update_lock:
            gate, drained = self._events()
            gate.clear()
            try:
                while self._inflight:
                    drained.clear()
                    await drained.wait()
                await asyncio.to_thread(self._apply_weights, apply)
                self.weights_version = self.weights_version + 1 if version is None else int(version)
            finally:
                gate.set()
        return self.weights_version

    def _apply_weights(self, apply: Callable[[Any], None]) -> None:
        with torch.no_grad():
            apply(self.model)

    def _events(self) -> tuple[asyncio.Event, asyncio.Event]:
        if self._gate is None or self._drained is None:
            self._gate, self._drained = asyncio.Event(), asyncio.Event()
            self._gate.set()
        return self._gate, self._drained

    async def _wait_for_weights(self) -> None:
        gate, _ = self._events()
        while not gate.is_set():
            await gate.wait()

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)  # OpenMP thread counts are per calling thread: set it here
        pending: list[_Job] = []
        while True:
            if not pending:
                job = self._queue.get()
                if job is None:
                    return
                pending.append(job)
                # Coming out of idle: give the rest of a burst a moment to arrive, so it shares this batch
                # instead of waiting for the whole next one.
                deadline = time.monotonic() + self.batch_wait_s
                while sum(j.n for j in pending) < self.max_batch_size:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        job = self._queue.get(timeout=remaining)
                    except queue.Empty:
                        break
                    if job is None:
                        self._fail(pending, RuntimeError("engine stopped"))
                        return
                    pending.append(job)
            while True:  # gather everything that is waiting
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    self._fail(pending, RuntimeError("engine stopped"))
                    return
                pending.append(job)
            batch: list[_Job] = []
            rows = width = 0
            while pending:
                job = pending[0]
                wider = max(width, len(job.prompt_ids))
                fits = rows + job.n <= self.max_batch_size and (rows + job.n) * wider <= self.max_batch_tokens
                if batch and not fits:
                    break
                batch.append(pending.pop(0))
                rows, width = rows + job.n, wider
            try:
                with torch.inference_mode():
                    self._run_batch(batch)
            except Exception as exc:  # a failed batch fails its requests, never the thread
                log.exception("generation batch failed")
                self._fail(batch, exc)

    @staticmethod
    def _fail(jobs: list[_Job], exc: BaseException) -> None:
        for job in jobs:
            job.loop.call_soon_threadsafe(_set_exception, job.future, exc)

    def _run_batch(self, jobs: list[_Job]) -> None:
        rows: list[_Row] = []
        for job in jobs:
            for i in range(job.n):
                gen = torch.Generator(device="cpu")
                seed = (job.params.seed + i) % 2**63 if job.params.seed is not None else random.getrandbits(63)
                gen.manual_seed(seed)
                rows.append(_Row(job, i, gen))
        self.batches += 1
        self.rows += len(rows)
        width = max(len(r.job.prompt_ids) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):
            ids = row.job.prompt_ids
            input_ids[b, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            mask[b, width - len(ids):] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        max_new = max(r.job.params.max_new_tokens for r in rows)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True)
        cache = out.past_key_values
        logits = out.logits[:, -1, :]
        for step in range(max_new):
            next_ids = self._sample(rows, logits)
            self.tokens += sum(1 for r in rows if not r.done)
            for b, row in enumerate(rows):
                if row.done:
                    continue
                self._advance(row, next_ids[b])
            if all(r.done for r in rows) or step + 1 == max_new:
                break
            feed = torch.tensor([r.ids[-1] if not r.done else self.pad_id for r in rows], dtype=torch.long,
                                device=self.device)[:, None]
            mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=self.device)], dim=1)
            positions = positions[:, -1:] + 1
            out = self.model(input_ids=feed, attention_mask=mask, position_ids=positions, past_key_values=cache,
                             use_cache=True)
            cache = out.past_key_values
            logits = out.logits[:, -1, :]
        for row in rows:
            if not row.done:
                row.done = True
                row.text = self._decode(row.ids)
                self._notify(row)
            row.job.results[row.index] = Generation(row.ids, row.logprobs, row.tops, row.text, row.finish)
        for job in jobs:
            job.loop.call_soon_threadsafe(_set_result, job.future, job.results)

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> list[tuple[int, float, list[tuple[int, float]]]]:
        """One token per row; tensor work is done once for the whole batch, Python work only where needed."""
        logits = logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)  # raw model distribution, as vLLM reports it
        tokens = logits.argmax(dim=-1).tolist()
        for b, row in enumerate(rows):
            p = row.job.params
            if row.done or p.temperature < GREEDY_BELOW:
                continue
            probs = torch.softmax(logits[b] / p.temperature, dim=-1)
            if p.top_p < 1.0:
                sorted_probs, order = torch.sort(probs, descending=True)
                keep = sorted_probs.cumsum(-1) - sorted_probs < p.top_p  # always keeps the top token
                sorted_probs = torch.where(keep, sorted_probs, torch.zeros_like(sorted_probs))
                probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
            tokens[b] = int(torch.multinomial(probs.cpu(), 1, generator=row.generator))
        index = torch.tensor(tokens, device=logprobs.device)[:, None]
        chosen = logprobs.gather(1, index)[:, 0].tolist()
        k = max((r.job.params.top_logprobs for r in rows if not r.done), default=0)
        tops: list[list[tuple[int, float]]] = [[] for _ in rows]
        if k:
            values, indices = torch.topk(logprobs, min(k, MAX_TOP_LOGPROBS), dim=-1)
            values, indices = values.tolist(), indices.tolist()
            for b, row in enumerate(rows):
                want = row.job.params.top_logprobs
                if want and not row.done:
                    tops[b] = list(zip(indices[b][:want], values[b][:want]))
        return [(tokens[b], chosen[b], tops[b]) for b in range(len(rows))]

    def _advance(self, row: _Row, pick: tuple[int, float, list[tuple[int, float]]]) -> None:
        token, logprob, tops = pick
        row.ids.append(token)
        row.logprobs.append(logprob)
        row.tops.append(tops)
        # Text is decoded every step only when someone reads it (stop strings, streaming).
        watch = bool(row.job.params.stop) or row.job.on_update is not None
        if token in self.stop_token_ids:
            row.done, row.finish = True, "stop"
            row.text = self._decode(row.ids[:-1])
        else:
            if len(row.ids) >= row.job.params.max_new_tokens:
                row.done = True
            if watch or row.done:
                row.text = self._decode(row.ids)
            for stop in row.job.params.stop:
                at = row.text.find(stop)
                if at >= 0:
                    row.text = row.text[:at]
                    row.done, row.finish = True, "stop"
                    break
        self._notify(row)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @staticmethod
    def _notify(row: _Row) -> None:
        callback = row.job.on_update
        if callback is not None:
            row.job.loop.call_soon_threadsafe(callback, row.index, row.text, row.done)


def _set_result(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
