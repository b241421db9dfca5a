"""reward_model building blocks in-process: formatting, pooling/padding, OOM split, batcher, transforms, config.

Uses a tiny random Llama reward model built offline. Out-of-memory cannot happen on
this CPU machine, so that one test raises the CUDA OOM error from a wrapped forward.
"""
from __future__ import annotations

import asyncio
import math
import random
import statistics

import pytest
import torch

from services.core.config import ConfigError, apply_overrides, build_server_config
from services.core.errors import BadRequest
from services.core.schemas import VerifyRequest
from services.resources.reward_model.app import Config
from services.resources.reward_model.batcher import DynamicBatcher
from services.resources.reward_model.formatting import Encoder, rollout_messages, validate_conversation
from services.resources.reward_model.scorer import HFScorer, ScoringError, load_tokenizer
from services.resources.reward_model.tiny_model import build_tiny_reward_model
from services.resources.reward_model.transforms import ScoreTransform
from gymserve.testing import response_with_text


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_reward_model(tmp_path_factory.mktemp("rm") / "tiny", seed=1)
    return str(path)


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return load_tokenizer(tiny)


def _reference(model_dir: str, sequences: list[list[int]]) -> list[float]:
    """Plain one-at-a-time forward: batch of 1, no padding, HF's own pooling at the last token."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.config.pad_token_id = None  # batch of one: HF pools the very last token
    with torch.inference_mode():
        return [model(input_ids=torch.tensor([ids])).logits[0, 0].item() for ids in sequences]


def _random_sequences(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    vocab = [i for i in range(len(tokenizer)) if i != tokenizer.pad_token_id]
    return [[tokenizer.bos_token_id] + [rng.choice(vocab) for _ in range(rng.randint(1, 90))] for _ in range(count)]


# ---- formatting ------------------------------------------------------------ #
def test_encoding_follows_nemo_rl_bos_eos_rules(tokenizer):
    enc = Encoder(tokenizer, max_model_len=512)
    conv = [{"role": "user", "content": "What is two plus two?"}, {"role": "assistant", "content": "four"}]
    text = enc.add_special(enc.format_conversation(conv))
    assert text.startswith("<s><|im_start|>user\n") and text.endswith("<|im_end|>\n</s>")
    assert enc.add_special(text) == text  # already there: not added twice
    assert enc.add_special("<s>x</s>\n") == "<s>x</s>\n"  # EOS followed by newlines counts (Qwen style)
    ids = enc.encode_conversation(conv).ids
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    # an empty think block a template inserts is dropped unless the messages carry one
    enc2 = Encoder(tokenizer, max_model_len=512, chat_template="{{ messages[0]['content'] }}\n<think>\n\n</think>\nA")
    assert enc2.format_conversation([{"role": "user", "content": "q"}]) == "qA"
    assert "<think>" in enc2.format_conversation([{"role": "user", "content": "<think>x"}])


def test_truncation_keeps_bos_and_the_end_or_the_start(tokenizer):
    ids = list(range(10, 40))
    left = Encoder(tokenizer, max_model_len=8).truncate([tokenizer.bos_token_id] + ids)
    assert left.truncated and left.num_tokens == 31 and left.ids == [tokenizer.bos_token_id] + ids[-7:]
    right = Encoder(tokenizer, max_model_len=8, truncation_side="right").truncate(ids)
    assert right.truncated and right.ids == ids[:8]
    fits = Encoder(tokenizer, max_model_len=30).truncate(ids)
    assert not fits.truncated and fits.ids == ids


@pytest.mark.parametrize("conversation, message", [
    ([{"content": "x"}], "[0].role"),
    ([{"role": "user", "content": 5}], "[0].content"),
    ([{"role": "user"}], "[0].content: missing"),
    ([{"role": "", "content": "x"}], "[0].role"),
    ([], "empty conversation"),
    ("hello", "expected a list of messages"),
    ([["user", "x"]], "expected an object"),
    ([{"role": "user", "content": [{"type": "image", "url": "u"}]}], "content[0]"),
])
def test_bad_conversations_are_named(conversation, message):
    with pytest.raises(BadRequest) as info:
        validate_conversation(conversation, "conversations[3]")
    assert "conversations[3]" in info.value.message and message in info.value.message


def test_template_rejection_is_a_bad_request(tokenizer):
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}x"
    enc = Encoder(tokenizer, max_model_len=64, chat_template=strict)
    with pytest.raises(BadRequest, match="first must be user"):
        enc.format_conversation([{"role": "assistant", "content": "a"}])


def test_rollout_messages_from_a_verify_request():
    request = VerifyRequest.model_validate({
        "responses_create_params": {"instructions": "be nice", "input": [
            {"role": "developer", "content": "dev"},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "hi "}, {"type": "input_text", "text": "there"}]},
            {"type": "function_call_output", "call_id": "c", "output": "tool"},
        ]},
        "response": response_with_text("hello"),
    })
    assert rollout_messages(request) == [
        {"role": "system", "content": "be nice"}, {"role": "system", "content": "dev"},
        {"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"},
    ]


# ---- scoring ------------------------------------------------------------- #
@pytest.mark.parametrize("side", ["right", "left"])
def test_batched_scores_equal_one_at_a_time(tiny, tokenizer, side):
    sequences = _random_sequences(tokenizer, 12, seed=3)
    scorer = HFScorer.load(tiny, "cpu", precision="float32", pad_id=tokenizer.pad_token_id, padding_side=side)
    batched = scorer.score(sequences)
    reference = _reference(tiny, sequences)
    assert len(set(round(x, 3) for x in reference)) > 6  # the inputs really differ
    for got, want in zip(batched, reference):
        assert abs(got - want) < 1e-4


def test_pad_token_equal_to_eos_does_not_move_the_pooled_token(tiny, tokenizer):
    """Sequences ending in EOS padded with EOS: HF's pad-id pooling would pick an earlier token; ours does not."""
    eos = tokenizer.eos_token_id
    sequences = [seq + [eos] for seq in _random_sequences(tokenizer, 5, seed=4)]
    scorer = HFScorer.load(tiny, "cpu", precision="float32", pad_id=eos, padding_side="right")
    for got, want in zip(scorer.score(sequences), _reference(tiny, sequences)):
        assert abs(got - want) < 1e-4


def test_out_of_memory_splits_the_batch_and_retries(tiny, tokenizer):
    scorer = HFScorer.load(tiny, "cpu", precision="float32", pad_id=tokenizer.pad_token_id, padding_side="right")
    plain = scorer.forward
    sizes = []

    def forward(batch):
        sizes.append(len(batch))
        if len(batch) > 3:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return plain(batch)

    scorer.forward = forward
    sequences = _random_sequences(tokenizer, 10, seed=5)
    scores = scorer.score(sequences)
    assert sizes[0] == 10 and max(sizes[1:]) <= 5 and scorer.oom_splits >= 2
    for got, want in zip(scores, _reference(tiny, sequences)):
        assert abs(got - want) < 1e-4

    def always_oom(batch):
        raise RuntimeError("CUDA error: out of memory")

    scorer.forward = always_oom
    failed = scorer.score(sequences[:2])
    assert len(failed) == 2 and all(isinstance(f, ScoringError) and "one sequence" in f.message for f in failed)


# ---- batcher ------------------------------------------------------------- #
async def test_batcher_groups_by_length_under_the_budget_and_keeps_order():
    seen: list[list[int]] = []

    def runner(batch):
        seen.append([len(s) for s in batch])
        return [float(sum(s)) for s in batch]

    batcher = DynamicBatcher([runner], max_batch_size=4, max_tokens_per_batch=200, max_wait_s=0.05).start()
    rng = random.Random(0)
    sequences = [[1] * rng.choice([5, 6, 7, 60, 61, 62]) for _ in range(24)]
    try:
        scores = await batcher.submit(sequences)
    finally:
        await batcher.close()
    assert scores == [float(len(s)) for s in sequences]
    assert sum(len(b) for b in seen) == 24
    for lengths in seen:
        assert len(lengths) <= 4 and len(lengths) * max(lengths) <= 200
        assert max(lengths) - min(lengths) <= 2  # sorted by length: short and long never share a batch
    assert batcher.stats.padding_fraction < 0.05


async def test_concurrent_requests_share_batches_and_failures_reach_every_waiter():
    calls: list[int] = []

    def runner(batch):
        calls.append(len(batch))
        if any(s == [13] for s in batch):
            raise ValueError("bad batch")
        return [float(s[0]) for s in batch]

    batcher = DynamicBatcher([runner], max_batch_size=64, max_tokens_per_batch=10_000, max_wait_s=0.05).start()
    try:
        results = await asyncio.gather(*(batcher.submit([[i]]) for i in range(1, 13)))
        assert [r[0] for r in results] == [float(i) for i in range(1, 13)]
        assert len(calls) < 12  # gathered, not one forward per request
        failed = await batcher.submit([[13], [14]])
        assert all(isinstance(r, ValueError) for r in failed)
        assert await batcher.submit([[15]]) == [15.0]  # the runner is free again
    finally:
        await batcher.close()


async def test_a_lone_sequence_over_the_budget_still_runs():
    batcher = DynamicBatcher([lambda b: [float(len(s)) for s in b]], max_batch_size=8, max_tokens_per_batch=10,
                             max_wait_s=0.0).start()
    try:
        assert await batcher.submit([[1] * 50, [1] * 3]) == [50.0, 3.0]
    finally:
        await batcher.close()


# ---- transforms and config ------------------------------------------------ #
def test_sigmoid_and_running_normalisation():
    assert ScoreTransform("raw")([1.5, -2.0]) == [1.5, -2.0]
    sig = ScoreTransform("sigmoid")([0.0, 2.0, -800.0])
    assert sig[0] == 0.5 and abs(sig[1] - 1 / (1 + math.exp(-2))) < 1e-12 and sig[2] == 0.0
    norm = ScoreTransform("normalize")
    first = norm([1.0, 2.0, 3.0])
    assert [round(x, 9) for x in first] == [-1.0, 0.0, 1.0]
    second = norm([10.0])
    values = [1.0, 2.0, 3.0, 10.0]
    assert abs(second[0] - (10.0 - statistics.fmean(values)) / statistics.stdev(values)) < 1e-9


@pytest.mark.parametrize("options, message", [
    ({"model_name": "m", "backend": "vllm"}, "vLLM is not installed"),
    ({"model_name": "m", "device": "gpu0"}, "device"),
    ({"model_name": "m", "precision": "int3"}, "precision"),
    ({}, "model_name"),
])
def test_config_errors_name_the_key(options, message):
    with pytest.raises(ConfigError, match=message):
        build_server_config(Config, {"kind": "resources/reward_model", **options}, where="resources/reward_model options")


def test_device_lists_parse():
    from services.resources.reward_model.scorer import resolve_devices

    assert resolve_devices("cpu") == ["cpu"]
    assert resolve_devices("0,1") == ["cuda:0", "cuda:1"]
    assert build_server_config(Config, {"model_name": "m", "device": "cuda:2, 3"}, where="x").device == "2,3"
    # `device=0` on the command line (the README's first example) arrives as a number, `device=[0,1]` as a list
    overrides = apply_overrides({"model_name": "m"}, ["device=0"])
    assert build_server_config(Config, overrides, where="x").device == "0"
    assert build_server_config(Config, {"model_name": "m", "device": [0, 1]}, where="x").device == "0,1"
    with pytest.raises(ConfigError, match="device"):
        build_server_config(Config, {"model_name": "m", "device": 1.5}, where="x")


async def test_missing_model_fails_startup_clearly(tmp_path):
    from services.resources.reward_model.app import RewardModel

    env = RewardModel(build_server_config(Config, {"model_name": str(tmp_path / "absent"), "device": "cpu"}, where="x"))
    with pytest.raises(RuntimeError, match="cannot load model_name=.*absent"):
        await env.startup()
    assert not env.ready()


async def test_replicas_each_run_batches_on_their_own_thread():
    """Two replicas (as with device=0,1): both get batches, each on its dedicated inference thread."""
    import threading

    used: dict[int, set[str]] = {0: set(), 1: set()}
    gate = threading.Barrier(2, timeout=10)

    def make(index):
        def runner(batch):
            used[index].add(threading.current_thread().name)
            if len(used[0]) + len(used[1]) <= 2:
                gate.wait()  # the first two batches are in flight at the same time, one per replica
            return [float(index)] * len(batch)
        return runner

    batcher = DynamicBatcher([make(0), make(1)], max_batch_size=2, max_tokens_per_batch=100, max_wait_s=0.01).start()
    try:
        results = await asyncio.gather(*(batcher.submit([[i], [i]]) for i in range(6)))
    finally:
        await batcher.close()
    assert {score for r in results for score in r} == {0.0, 1.0}
    assert len(used[0]) == 1 and len(used[1]) == 1 and used[0] != used[1]


async def test_a_sequence_that_cannot_be_scored_is_masked_not_zero(tiny):
    """Simulated OOM (no GPU here) on the long conversation only: it is masked as a crash, the others scored."""
    from services.core.schemas import VerifyRequest
    from services.resources.reward_model.app import RewardModel

    env = RewardModel(build_server_config(Config, {"model_name": tiny, "device": "cpu", "max_wait_ms": 50}, where="x"))
    await env.startup()
    try:
        scorer = env.scorers[0]
        plain = scorer.forward

        def forward(batch):
            if any(len(s) > 100 for s in batch):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
            return plain(batch)

        scorer.forward = forward
        rows = [VerifyRequest.model_validate({"responses_create_params": {"input": [{"role": "user", "content": q}]},
                                              "response": response_with_text("an answer")})
                for q in ("short question", "long " * 150, "another one")]
        replies = await env.verify_many(rows)
        assert [r.mask_sample for r in replies] == [False, True, False]
        assert replies[1].failure_kind == "crash" and "one sequence" in replies[1].failure_reason
        assert replies[0].reward != replies[2].reward
        single = await env.verify(rows[1], None)
        assert single.mask_sample and single.failure_kind == "crash"
    finally:
        await env.shutdown()
    assert env.scorers == [] and not env.ready()


async def test_not_ready_until_the_model_is_loaded(tiny):
    import httpx

    from services.resources.reward_model.app import build

    app = build(build_server_config(Config, {"model_name": tiny, "device": "cpu"}, where="x"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://rm") as client:
        assert (await client.get("/ready")).status_code == 503  # lifespan (the model load) has not run
        reply = await client.post("/score", json={"conversations": [[{"role": "user", "content": "x"}]]})
        assert reply.status_code == 503 and "not loaded" in reply.json()["detail"]
    env = app.state.env
    await env.startup()
    try:
        assert env.ready()
    finally:
        await env.shutdown()


def test_model_name_tiny_builds_the_random_model_once_into_the_cache(tmp_path, monkeypatch):
    """`model_name: tiny` (the default stack's setting) resolves to one cached folder, built on first use."""
    from services.resources.reward_model.tiny_model import TINY_NAME, cached_tiny_reward_model

    monkeypatch.setenv("GYMSERVE_CACHE_DIR", str(tmp_path))
    assert TINY_NAME == "tiny"
    folder = cached_tiny_reward_model()
    assert folder.parent == tmp_path / "models" and (folder / "config.json").is_file()
    built = (folder / "config.json").stat().st_mtime_ns
    assert cached_tiny_reward_model() == folder and (folder / "config.json").stat().st_mtime_ns == built
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.startswith(".")] == [folder.name]
    assert load_tokenizer(str(folder)).chat_template  # a complete model folder, tokenizer included


def test_attention_on_a_gpu_skips_cudnn():
    """cuDNN's attention builds a plan for every new batch shape on the CPU: 93 ms per fresh batch of 32
    on an H200 against 7.7 ms without it (measured on the GPU machine, docs/benchmarks.md). A scorer on
    a GPU turns it off; on the CPU nothing changes. Only the flag is checked here: this machine has no GPU."""
    import torch

    from services.resources.reward_model.scorer import skip_cudnn_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        skip_cudnn_attention("cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()
        skip_cudnn_attention("cuda:0")
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
