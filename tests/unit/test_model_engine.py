"""The continuously batched engine of models/hf, in-process with a tiny local Llama (random weights).

Rows join the running batch while it decodes and leave when they finish; their tokens and
logprobs must equal decoding each prompt alone. No timing assertions: only orderings and values.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from services.models.hf.engine import Engine  # noqa: E402
from services.models.hf.types import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def model_and_tokenizer(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from services.models.hf.tiny import make_tiny_model

    folder = make_tiny_model(Path(tmp_path_factory.mktemp("tiny")) / "model", hidden=64, layers=2)
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return model, tok


def _engine(model_and_tokenizer, **kwargs) -> Engine:
    model, tok = model_and_tokenizer
    # no stop tokens: random weights would stop at arbitrary points, lengths are set by max_new_tokens
    engine = Engine(model, tok, device=torch.device("cpu"), stop_token_ids=set(), threads=1, **kwargs)
    engine.start()
    return engine


def _greedy(tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=tokens)


def _reference(model_and_tokenizer, prompt: list[int], tokens: int) -> tuple[list[int], list[float]]:
    """Plain one-sequence greedy decoding with the model's own cache: what batching must not change."""
    model, _ = model_and_tokenizer
    ids, logprobs, cache = list(prompt), [], None
    feed = torch.tensor([prompt])
    with torch.inference_mode():
        for _ in range(tokens):
            out = model(input_ids=feed, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            lp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            token = int(lp.argmax())
            ids.append(token)
            logprobs.append(float(lp[token]))
            feed = torch.tensor([[token]])
    return ids[len(prompt):], logprobs


PROMPTS = [[1, 2, 3], list(range(10, 40)), [7] * 11, list(range(100, 105)), list(range(200, 260))]
LENGTHS = [40, 6, 25, 1, 12]


def test_staggered_arrivals_equal_one_at_a_time_greedy(model_and_tokenizer) -> None:
    engine = _engine(model_and_tokenizer, max_batch_size=4, batch_wait_s=0.0)

    async def scenario():
        tasks = []
        for k, (prompt, length) in enumerate(zip(PROMPTS, LENGTHS)):
            tasks.append(asyncio.create_task(engine.generate(prompt, _greedy(length))))
            if k % 2:  # let a few decoding steps pass, so later rows join a running batch
                while engine.steps < 3 * k:
                    await asyncio.sleep(0.001)
        return await asyncio.gather(*tasks)

    try:
        results = asyncio.run(scenario())
    finally:
        engine.stop()
    assert engine.batches >= 2  # rows were admitted in more than one group...
    assert engine.steps < sum(LENGTHS)  # ...and decoded together, not one after the other
    for prompt, length, (gen,) in zip(PROMPTS, LENGTHS, results):
        ids, logprobs = _reference(model_and_tokenizer, prompt, length)
        assert gen.token_ids == ids
        assert gen.logprobs == pytest.approx(logprobs, abs=1e-4)
        assert gen.finish_reason == "length"


def test_short_row_leaves_before_the_long_one_ends(model_and_tokenizer) -> None:
    engine = _engine(model_and_tokenizer, max_batch_size=8, batch_wait_s=0.0)
    order: list[str] = []

    async def scenario():
        async def run(name, prompt, length):
            await engine.generate(prompt, _greedy(length))
            order.append(name)

        long = asyncio.create_task(run("long", [5, 6, 7], 300))
        while engine.steps < 2:
            await asyncio.sleep(0.001)
        await run("short", [8, 9], 3)  # joins the running batch, leaves after 3 tokens
        await long

    try:
        asyncio.run(scenario())
    finally:
        engine.stop()
    assert order == ["short", "long"]


def test_rows_of_very_different_lengths_decode_in_separate_batches(model_and_tokenizer) -> None:
    """Short prompts joining a batch that holds a long one would pad their caches to the long width
    (mostly padding): they decode in a batch of their own instead, with the same tokens and logprobs
    as alone."""
    engine = _engine(model_and_tokenizer, max_batch_size=4, batch_wait_s=0.0)
    long_prompt, short_prompts = list(range(10, 400)), [[8, 9], [4, 5, 6], [7]]
    lanes: list[int] = []

    async def scenario():
        long = asyncio.create_task(engine.generate(long_prompt, _greedy(60)))
        while engine.steps < 2:
            await asyncio.sleep(0.001)
        engine.batch_wait_s = 60.0  # the three short rows join together, when they fill the free rows
        short = asyncio.gather(*(engine.generate(p, _greedy(20)) for p in short_prompts))
        while not short.done():
            lanes.append(engine.lanes)
            await asyncio.sleep(0.001)
        return [await long, *await short]

    try:
        results = asyncio.run(scenario())
    finally:
        engine.stop()
    assert max(lanes) == 2
    for prompt, (gen,) in zip([long_prompt, *short_prompts], results):
        ids, logprobs = _reference(model_and_tokenizer, prompt, len(gen.token_ids))
        assert gen.token_ids == ids
        assert gen.logprobs == pytest.approx(logprobs, abs=1e-4)


@pytest.mark.timeout(120)
def test_a_cancelled_request_leaves_the_batch_and_the_engine_goes_on(model_and_tokenizer) -> None:
    """A request cancelled mid-generation (its client went away) stops decoding: its rows leave the
    batch long before its 100,000 tokens, and the next request is served."""
    engine = _engine(model_and_tokenizer, max_batch_size=8, batch_wait_s=0.0)

    async def scenario():
        endless = asyncio.create_task(engine.generate([5, 6, 7], _greedy(100_000)))
        while engine.steps < 2:
            await asyncio.sleep(0.001)
        endless.cancel()
        with pytest.raises(asyncio.CancelledError):
            await endless
        while engine.running:  # until the engine dropped the cancelled rows
            await asyncio.sleep(0.001)
        return await engine.generate([8, 9], _greedy(3))

    try:
        (after,) = asyncio.run(scenario())
    finally:
        engine.stop()
    assert len(after.token_ids) == 3 and engine.steps < 100_000


def test_a_burst_joins_the_running_batch_as_one_group(model_and_tokenizer) -> None:
    """Rows that arrive while a batch decodes join together (one prefill, one cache merge), not one
    by one: the group is admitted when it fills the free rows, here at once."""
    engine = _engine(model_and_tokenizer, max_batch_size=4, batch_wait_s=0.0)

    async def scenario():
        first = asyncio.create_task(engine.generate([1, 2], _greedy(400)))
        while engine.steps < 1:
            await asyncio.sleep(0.001)
        engine.batch_wait_s = 60.0  # a lone newcomer would wait: only filling the free rows admits it
        burst = await asyncio.gather(*(engine.generate([3 + k, 4], _greedy(5)) for k in range(3)))
        await first
        return burst

    try:
        burst = asyncio.run(scenario())
    finally:
        engine.stop()
    assert engine.batches == 2  # the first row's prefill, then the three newcomers together
    assert [len(gen.token_ids) for (gen,) in burst] == [5, 5, 5]


def test_seeded_sampling_does_not_depend_on_batch_neighbours(model_and_tokenizer) -> None:
    engine = _engine(model_and_tokenizer, max_batch_size=8, batch_wait_s=0.0)
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)

    async def scenario():
        alone = await engine.generate([4, 5, 6], params)
        crowd = [asyncio.create_task(engine.generate([9] * k, SamplingParams(temperature=1.0, max_new_tokens=20)))
                 for k in range(1, 4)]
        while engine.steps < 2:
            await asyncio.sleep(0.001)
        joined = await engine.generate([4, 5, 6], params)
        await asyncio.gather(*crowd)
        return alone, joined

    try:
        (alone,), (joined,) = asyncio.run(scenario())
    finally:
        engine.stop()
    assert alone.token_ids == joined.token_ids
    assert alone.logprobs == pytest.approx(joined.logprobs, abs=1e-4)
