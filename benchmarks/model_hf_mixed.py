"""models/hf's engine on a batch of mixed prompt lengths, as a multi-environment collection sends it:
one long tool prompt beside short single-turn ones, all at once, against the same prompts one after
the other.

    .venv/bin/python benchmarks/model_hf_mixed.py [--long 3000] [--short 120] [--shorts 7] [--tokens 32]
                                                 [--rounds 2] [--base REV]

The engine runs in-process on the embedded SmolLM2-135M-Instruct (float32, one torch thread, greedy,
fresh random prompts every round). Prints seconds for the whole batch at once and one at a time,
and their ratio (at once / one at a time: below 1 means batching helps). With `--base REV`, the
engine of that git revision runs the same batch in the same rounds (interleaved), and the ratio
base/now is printed too.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def engine_at(revision: str, folder: Path) -> ModuleType:
    """services/models/hf/engine.py as it was at `revision`, imported under a name of its own."""
    source = subprocess.run(["git", "show", f"{revision}:services/models/hf/engine.py"], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout
    path = folder / "engine_base.py"
    path.write_text(source.replace("from .types import", "from services.models.hf.types import"))
    spec = importlib.util.spec_from_file_location("engine_base", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["engine_base"] = module
    spec.loader.exec_module(module)
    return module


async def timed(engine_module: ModuleType, model: Any, tok: Any, prompts: list[list[int]], tokens: int,
                together: bool) -> float:
    import torch

    from services.models.hf.types import SamplingParams

    engine = engine_module.Engine(model, tok, device=torch.device("cpu"), stop_token_ids=set(), threads=1)
    engine.start()
    params = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    try:
        started = time.monotonic()
        if together:
            await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        else:
            for p in prompts:
                await engine.generate(p, params)
        return time.monotonic() - started
    finally:
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--long", type=int, default=3000, help="tokens of the one long prompt")
    parser.add_argument("--short", type=int, default=120, help="tokens of each short prompt")
    parser.add_argument("--shorts", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--base", default=None, help="also run the engine of this git revision")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from services.models.hf import engine as engine_now
    from services.models.hf.embedded import embedded_model_dir

    folder = embedded_model_dir()
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        base = engine_at(args.base, Path(tmp)) if args.base else None
        for r in range(args.rounds):
            prompts = [[rng.randrange(100, 40000) for _ in range(args.long)]]
            prompts += [[rng.randrange(100, 40000) for _ in range(args.short)] for _ in range(args.shorts)]
            at_once = asyncio.run(timed(engine_now, model, tok, prompts, args.tokens, together=True))
            one_by_one = asyncio.run(timed(engine_now, model, tok, prompts, args.tokens, together=False))
            line = (f"round {r}: {len(prompts)} prompts ({args.long} + {args.shorts} x {args.short} tokens) at once "
                    f"{at_once:.1f} s, one at a time {one_by_one:.1f} s, ratio {at_once / one_by_one:.2f}")
            if base is not None:
                before = asyncio.run(timed(base, model, tok, prompts, args.tokens, together=True))
                line += f"; {args.base} at once {before:.1f} s, {args.base}/now {before / at_once:.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
