"""Continuously batched generation engine: one dedicated thread runs every forward pass.

A running batch is one left-padded KV cache. At every decoding step the thread admits
waiting requests (first come, first served, as many rows as fit `max_batch_size`, `n`
counts as n rows): their prompts are prefilled together and their caches are merged into
a running batch, so new sequences join without waiting for the batch to finish. Rows of
very different lengths run in separate batches, each stepped in turn: padding a short math
prompt's cache to a long tool prompt's width would make every one of its steps read (and
every merge copy) mostly padding. Rows that finish (stop token, stop string, max tokens)
leave at once: their cache rows are dropped and all-padding columns trimmed, so a short
rollout never waits for the longest one.
Each row keeps its own sampling settings and seeded generator; the logprob of every
sampled token is read from the same forward pass that sampled it. torch releases the GIL
during the forward passes, so the event loop stays responsive.

`update_weights` is the one way to quiesce it: new generations wait at a gate while the running
ones finish, the weights are swapped, the gate opens.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from services.core.errors import Conflict

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
    left: int = 0  # rows still decoding
    queued_at: float = 0.0


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


class _Batch:
    """The running rows and their shared left-padded KV cache, attention mask and next positions."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [rows, columns], 0 on left padding
        self.positions: torch.Tensor | None = None  # [rows, 1], position of the token fed next

    def __len__(self) -> int:
        return len(self.rows)

    def takes(self, mask: torch.Tensor) -> bool:
        """Whether rows with this prompt mask may join: after the merge, padding stays at most half
        of the cache."""
        if not self.rows:
            return True
        assert self.mask is not None
        cells = (len(self.rows) + mask.shape[0]) * max(self.mask.shape[1], mask.shape[1])
        return cells <= 2 * (int(self.mask.sum()) + int(mask.sum()))

    def merge(self, rows: list[_Row], cache: Any, mask: torch.Tensor, positions: torch.Tensor) -> None:
        """Append freshly prefilled rows; the shorter side is left-padded to the longer one."""
        if not self.rows:
            self.rows, self.cache, self.mask, self.positions = rows, cache, mask, positions
            return
        assert self.mask is not None and self.positions is not None
        old, new = self.mask.shape[1], mask.shape[1]
        width = max(old, new)
        for mine, theirs in zip(self.cache.layers, cache.layers):
            mine.keys = torch.cat([_left_pad(mine.keys, width), _left_pad(theirs.keys, width)], dim=0)
            mine.values = torch.cat([_left_pad(mine.values, width), _left_pad(theirs.values, width)], dim=0)
        self.mask = torch.cat([_left_pad(self.mask, width, dim=1), _left_pad(mask, width, dim=1)], dim=0)
        self.positions = torch.cat([self.positions, positions], dim=0)
        self.rows = self.rows + rows

    def drop_finished(self) -> list[_Row]:
        """Remove finished rows from the batch and trim columns that are padding in every row left."""
        finished = [r for r in self.rows if r.done]
        if not finished:
            return []
        keep = [b for b, r in enumerate(self.rows) if not r.done]
        self.rows = [self.rows[b] for b in keep]
        if not keep:
            self.cache = self.mask = self.positions = None
            return finished
        assert self.mask is not None and self.positions is not None
        index = torch.tensor(keep, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        used = mask.any(dim=0).nonzero()
        skip = int(used[0]) if len(used) else 0
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, skip:]
            layer.values = layer.values.index_select(0, index)[:, :, skip:]
        self.mask = mask[:, skip:]
        self.positions = self.positions.index_select(0, index)
        return finished


def _left_pad(t: torch.Tensor, width: int, dim: int = 2) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing <= 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([torch.zeros(shape, dtype=t.dtype, device=t.device), t], dim=dim)


def _mergeable(cache: Any) -> bool:
    """Only plain dynamic layers ([batch, heads, seq, dim] keys/values) can be merged and trimmed."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


class Engine:
    """Owns the model; `await generate(...)` from any coroutine."""

    def __init__(self, model: Any, tokenizer: Any, *, device: torch.device, max_batch_size: int = 16,
                 max_batch_tokens: int = 32768, batch_wait_s: float = 0.02,
                 stop_token_ids: set[int] | None = None, threads: int | None = None,
                 continuous: bool = True) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.threads = threads
        self.continuous = continuous  # False: a batch runs to its end before the next is admitted
        self.max_batch_tokens = max_batch_tokens  # padded prompt tokens per prefill: one long prompt is not copied 16x
        self.stop_token_ids = set(stop_token_ids or ())
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (next(iter(self.stop_token_ids)) if self.stop_token_ids else 0)
        # The prefill needs each row's last position only (as `generate` asks): the vocabulary
        # projection of every prompt token is a tenth of a small model's prefill.
        forward = inspect.signature(model.forward).parameters
        self._last_logits: dict[str, Any] = {"logits_to_keep": 1} if "logits_to_keep" in forward else {}
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.batches = 0  # prefills (groups of rows admitted together)
        self.rows = 0
        self.tokens = 0
        self.steps = 0  # decoding forward passes
        self.running = 0  # rows decoding now
        self.lanes = 0  # running batches now: rows of very different lengths decode apart
        self.waiting = 0  # rows queued, not yet admitted
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
            if params.max_new_tokens <= 0:
                generations = [Generation([], [], [], "", "length") for _ in range(n)]
            else:
                loop = asyncio.get_running_loop()
                job = _Job(list(prompt_ids), params, n, loop, loop.create_future(), on_update, [None] * n, n,
                           time.monotonic())
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
            if version is not None and version <= self.weights_version:  # checked again: updates may race
                raise Conflict(f"version: {version} is not newer than the served weights_version "
                               f"{self.weights_version}; versions only move forward")
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
        batches: list[_Batch] = []
        while True:
            idle = not batches and not pending
            try:
                stopped = self._collect(pending, block=idle)
            except Exception:  # never let the thread die
                log.exception("generation queue failed")
                stopped = False
            if stopped:
                self._fail([r.job for b in batches for r in b.rows] + pending, RuntimeError("engine stopped"))
                return
            self._drop_cancelled(pending, batches)
            batches = [b for b in batches if b]
            running = sum(len(b) for b in batches)
            self.running, self.waiting = running, sum(j.n for j in pending)
            if pending and (self.continuous or not batches) and self._may_join(pending, running):
                group = self._admissible(pending, running)
                if group:
                    try:
                        with torch.inference_mode():
                            self._prefill(group, batches)
                    except Exception as exc:  # a failed prefill fails its requests, never the thread
                        log.exception("prefill failed")
                        self._fail(group, exc)
            for batch in batches:
                if not batch:
                    continue
                try:
                    with torch.inference_mode():
                        self._step(batch)
                except Exception as exc:  # a failed step fails the batch's requests, never the thread
                    log.exception("decoding step failed")
                    self._fail(list({id(r.job): r.job for r in batch.rows}.values()), exc)
                    batch.rows = []
            batches = [b for b in batches if b]
            self.running, self.lanes = sum(len(b) for b in batches), len(batches)

    def _collect(self, pending: list[_Job], *, block: bool) -> bool:
        """Move queued jobs into `pending`; True when stop() was called."""
        if block:
            item = self._queue.get()
            if item is None:
                return True
            pending.append(item)
            # Coming out of idle: give the rest of a burst a moment to arrive, so it shares this prefill.
            deadline = time.monotonic() + self.batch_wait_s
            while sum(j.n for j in pending) < self.max_batch_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self._queue.get(timeout=remaining)
                except queue.Empty:
                    break
                if item is None:
                    return True
                pending.append(item)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return False
            if item is None:
                return True
            pending.append(item)

    @staticmethod
    def _drop_cancelled(pending: list[_Job], batches: list[_Batch]) -> None:
        """Jobs whose request was cancelled (its client went away) give up their place and their rows:
        nobody reads what they would generate."""
        pending[:] = [job for job in pending if not job.future.cancelled()]
        for batch in batches:
            gone = [row for row in batch.rows if row.job.future.cancelled()]
            for row in gone:
                row.done = True
            if gone:
                batch.drop_finished()  # finished rows already left in `_finish`: only these go

    def _may_join(self, pending: list[_Job], running: int) -> bool:
        """Whether waiting rows are prefilled now. Into a running batch they join as a group: when
        they fill its free rows or the oldest has waited `batch_wait_s`. Every join costs a prefill
        forward pass and a copy of the running cache, so a burst arriving over a few milliseconds
        joins once, not request by request."""
        if not running:
            return True  # idle: `_collect` already waited for the burst
        waiting = sum(job.n for job in pending)
        return (waiting >= self.max_batch_size - running
                or time.monotonic() - pending[0].queued_at >= self.batch_wait_s)

    def _admissible(self, pending: list[_Job], running: int) -> list[_Job]:
        """The oldest waiting jobs that fit beside the running rows (first come, first served).

        A group's prompts are left-padded to its longest one, so a short prompt never shares a prefill
        whose padding would outweigh the prompts: after a long workplace prompt, the short math prompts
        behind it join at the next step as their own group instead of being padded to its length."""
        group: list[_Job] = []
        rows = width = tokens = 0
        while pending:
            job = pending[0]
            wider = max(width, len(job.prompt_ids))
            padded = (rows + job.n) * wider
            lean = padded <= 2 * (tokens + job.n * len(job.prompt_ids))
            fits = (running + rows + job.n <= self.max_batch_size and padded <= self.max_batch_tokens
                    and (lean or not group))
            if not fits and (group or running):
                break  # the head of the queue waits for room; nobody overtakes it
            group.append(pending.pop(0))
            rows, width, tokens = rows + job.n, wider, tokens + job.n * len(job.prompt_ids)
        return group

    @staticmethod
    def _fail(jobs: list[_Job], exc: BaseException) -> None:
        for job in jobs:
            job.loop.call_soon_threadsafe(_set_exception, job.future, exc)

    def _prefill(self, jobs: list[_Job], batches: list[_Batch]) -> None:
        """Run the prompts of `jobs` together, sample each row's first token, merge them into the first
        running batch they fit by width (or a batch of their own)."""
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
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         **self._last_logits)
        self._pick(rows, out.logits[:, -1, :])
        cache = out.past_key_values
        batch = next((b for b in batches if b.takes(mask)), None)
        if batch is None:
            batch = _Batch()
            batches.append(batch)
        if batch and not _mergeable(cache):
            raise RuntimeError("this model's KV cache cannot be merged (continuous=False serves it)")
        batch.merge(rows, cache, mask, positions[:, -1:] + 1)
        self._finish(batch)

    def _step(self, batch: _Batch) -> None:
        """One decoding step for every running row: feed its last token, sample the next."""
        assert batch.mask is not None and batch.positions is not None
        feed = torch.tensor([r.ids[-1] for r in batch.rows], dtype=torch.long, device=self.device)[:, None]
        batch.mask = torch.cat([batch.mask, torch.ones((len(batch), 1), dtype=batch.mask.dtype,
                                                       device=batch.mask.device)], dim=1)
        out = self.model(input_ids=feed, attention_mask=batch.mask, position_ids=batch.positions,
                         past_key_values=batch.cache, use_cache=True)
        batch.cache = out.past_key_values
        batch.positions = batch.positions + 1
        self.steps += 1
        self._pick(batch.rows, out.logits[:, -1, :])
        self._finish(batch)

    def _pick(self, rows: list[_Row], logits: torch.Tensor) -> None:
        picks = self._sample(rows, logits)
        self.tokens += len(rows)
        for row, pick in zip(rows, picks):
            self._advance(row, pick)

    def _finish(self, batch: _Batch) -> None:
        """Hand finished rows back; a job completes when its last row does."""
        for row in batch.drop_finished():
            job = row.job
            job.results[row.index] = Generation(row.ids, row.logprobs, row.tops, row.text, row.finish)
            job.left -= 1
            if job.left == 0:
                job.loop.call_soon_threadsafe(_set_result, job.future, job.results)

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> list[tuple[int, float, list[tuple[int, float]]]]:
        """One token per row; tensor work is done once for the whole batch, Python work only where needed."""
        logits = logits.float()
        # log-probabilities of the raw model distribution, as vLLM reports them: logit - logsumexp,
        # computed for the tokens read only (a full log_softmax writes rows x vocabulary floats)
        norm = torch.logsumexp(logits, dim=-1, keepdim=True)
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
        index = torch.tensor(tokens, device=logits.device)[:, None]
        chosen = (logits.gather(1, index) - norm)[:, 0].tolist()
        k = max((r.job.params.top_logprobs for r in rows if not r.done), default=0)
        tops: list[list[tuple[int, float]]] = [[] for _ in rows]
        if k:
            values, indices = torch.topk(logits, min(k, MAX_TOP_LOGPROBS), dim=-1)
            values, indices = (values - norm).tolist(), indices.tolist()
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
