"""Weight updates for a running models/hf policy server (on-policy RL on one host).

A trainer on the same host writes its current weights as one safetensors file (in
`/dev/shm` when it exists, so the bytes never touch a disk) and tells the server its path
and the new version with `POST /v1/weights`. The server reads the file, checks that every
tensor matches the served model by name and shape, and swaps the weights in with
`Engine.update_weights`: new generations wait, generations already running finish on the
old weights, the tensors are copied in place, the version advances, generation resumes.
So every reply's `policy_version` names the weights that produced all of its tokens.

Weights never travel over the network as JSON: only a path and a version do.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Request
from pydantic import BaseModel, Field

from services.core.app import read_json
from services.core.errors import BadRequest, GymError, Unavailable
from services.core.openapi import describe

from .. import openai_api as oa


class WeightsUpdate(BaseModel):
    """Body of `POST /v1/weights`."""

    path: str = Field(..., description="a .safetensors file on this host with the model's tensors (all or some)")
    version: int = Field(..., ge=0, description="the trainer's weights version (its optimizer step)")


def add_weights_route(app: FastAPI, *, accept: bool, unavailable: Callable[[], str | None],
                      apply: Callable[[str, int], Awaitable[int]]) -> None:
    """`POST /v1/weights` of a policy server (models/hf swaps the tensors in, models/vllm pushes them
    into vLLM): off unless the stack accepts weights, a 503 while `unavailable()` names a reason."""

    @app.post("/v1/weights", **describe(body=WeightsUpdate, reply={"type": "object", "properties": {
        "weights_version": {}, "seconds": {"type": "number"}}}, errors=(403, 409, 503)))
    async def update_weights(request: Request) -> dict[str, Any]:
        update: WeightsUpdate = oa.parse_request(WeightsUpdate, await read_json(request))
        if not accept:
            raise GymError("weight updates are off on this server (start it with accept_weights=true: "
                           "training stacks set it)", status_code=403)
        reason = unavailable()
        if reason:
            raise Unavailable(reason)
        started = time.perf_counter()
        version = await apply(update.path, update.version)
        return {"weights_version": version, "seconds": round(time.perf_counter() - started, 3)}


def check_path(path: str) -> Path:
    """`path` names an existing .safetensors file (a 400 naming `path` otherwise)."""
    file = Path(path)
    if file.suffix != ".safetensors":
        raise BadRequest("path: must name a .safetensors file")
    if not file.is_file():
        raise BadRequest(f"path: no such file {path}")
    return file


def read_tensors(path: str) -> dict[str, Any]:
    """The tensors of a safetensors file, as a private copy; a 400 naming `path` when it cannot be read.

    The file is read into memory whole and parsed from there (never memory-mapped): a file
    truncated or rewritten while we use it cannot fault the server (SIGBUS on a lazy mapping)."""
    from safetensors.torch import load

    file = check_path(path)
    try:
        return load(file.read_bytes())
    except Exception as exc:  # a truncated or foreign file
        raise BadRequest(f"path: not a readable safetensors file ({type(exc).__name__}: {exc})") from None


def check_tensors(model: Any, tensors: dict[str, Any]) -> None:
    """Every tensor must name a parameter or buffer of `model` with the same shape (a 400 otherwise)."""
    own = dict(model.state_dict())
    if not tensors:
        raise BadRequest("path: the file holds no tensors")
    unknown = sorted(set(tensors) - set(own))
    if unknown:
        raise BadRequest(f"path: tensors the served model does not have: {unknown[:5]}")
    wrong = [f"{k} {tuple(v.shape)} != {tuple(own[k].shape)}" for k, v in tensors.items() if v.shape != own[k].shape]
    if wrong:
        raise BadRequest(f"path: tensor shapes differ from the served model: {wrong[:5]}")


def copy_into(model: Any, tensors: dict[str, Any]) -> None:
    """Copy `tensors` into `model`'s parameters in place (dtype and device converted). Tied weights
    (one tensor under two names) are simply written twice with the same values."""
    import torch

    own = model.state_dict()
    with torch.no_grad():
        for name, value in tensors.items():
            own[name].copy_(value.to(dtype=own[name].dtype, device=own[name].device))


def shared_dir() -> Path:
    """Where a trainer writes weight files: RAM-backed `/dev/shm` when present, else the temp dir."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def save_tensors(state_dict: dict[str, Any], path: Path) -> None:
    """Write a state dict as safetensors atomically (tied tensors deduplicated by cloning)."""
    from safetensors.torch import save_file

    seen: set[int] = set()
    tensors: dict[str, Any] = {}
    for name, value in state_dict.items():
        value = value.detach()
        key = value.data_ptr()
        tensors[name] = value.clone().contiguous() if key in seen else value.contiguous()
        seen.add(key)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)
