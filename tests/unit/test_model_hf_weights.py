"""Engine.update_weights: new generations wait, in-flight ones finish on the old weights, versions are exact."""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from services.models.hf.types import SamplingParams


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from services.models.hf.tiny import make_tiny_model

    folder = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return AutoModelForCausalLM.from_pretrained(str(folder)).eval(), AutoTokenizer.from_pretrained(str(folder))


def _engine(model, tokenizer):
    from services.models.hf.engine import Engine

    engine = Engine(model, tokenizer, device=torch.device("cpu"), max_batch_size=4, threads=1)
    engine.start()
    return engine


def test_in_flight_generations_finish_on_old_weights_and_new_ones_wait(tiny) -> None:
    model, tokenizer = tiny
    engine = _engine(model, tokenizer)
    in_flight_at_apply: list[int] = []
    applied = threading.Event()

    def apply(m) -> None:
        in_flight_at_apply.append(engine._inflight)
        for p in m.parameters():
            p.add_(0.01)
        applied.set()

    async def scenario() -> tuple[list, list, int]:
        long = SamplingParams(temperature=1.0, max_new_tokens=48, seed=1)
        first = asyncio.create_task(engine.generate([1, 2, 3], long, n=2))
        await asyncio.sleep(0)  # `first` passed the gate and is queued
        update = asyncio.create_task(engine.update_weights(apply))
        await asyncio.sleep(0)  # the gate is closed now
        later = asyncio.create_task(engine.generate([4, 5], SamplingParams(max_new_tokens=4, seed=2)))
        old = await first
        version = await update
        new = await later
        return old, new, version

    try:
        old, new, version = asyncio.run(scenario())
    finally:
        engine.stop()
    assert applied.is_set() and in_flight_at_apply == [0]
    assert version == 1 == engine.weights_version
    assert [g.policy_version for g in old] == [0, 0]
    assert [g.policy_version for g in new] == [1]


def test_explicit_version_and_failed_apply(tiny) -> None:
    model, tokenizer = tiny
    engine = _engine(model, tokenizer)

    def boom(m) -> None:
        raise RuntimeError("bad tensors")

    async def scenario() -> tuple[int, int]:
        set_to = await engine.update_weights(lambda m: None, version=7)
        with pytest.raises(RuntimeError):
            await engine.update_weights(boom, version=9)
        gens = await engine.generate([1, 2], SamplingParams(max_new_tokens=2, seed=0))  # the gate reopened
        return set_to, gens[0].policy_version

    try:
        set_to, used = asyncio.run(scenario())
    finally:
        engine.stop()
    assert set_to == 7 and used == 7 and engine.weights_version == 7


def test_save_and_check_tensors_round_trip(tiny, tmp_path) -> None:
    from services.core.errors import BadRequest
    from services.models.hf.weights import check_tensors, copy_into, read_tensors, save_tensors

    model, _ = tiny
    path = tmp_path / "w.safetensors"
    state = {k: v + 1.0 for k, v in model.state_dict().items()}
    save_tensors(state, path)  # tied embeddings: two names, one storage in the model
    tensors = read_tensors(str(path))
    check_tensors(model, tensors)
    clone = type(model)(model.config)
    copy_into(clone, tensors)
    for name, value in clone.state_dict().items():
        assert torch.equal(value, state[name]), name
    with pytest.raises(BadRequest, match="path"):
        check_tensors(model, {"not.a.param": torch.zeros(1)})
    with pytest.raises(BadRequest, match="shapes"):
        check_tensors(model, {"lm_head.weight": torch.zeros(1, 1)})
    with pytest.raises(BadRequest, match="path"):
        read_tensors(str(tmp_path / "missing.safetensors"))
    with pytest.raises(BadRequest, match="safetensors"):
        read_tensors(str(tmp_path / "w.bin"))
