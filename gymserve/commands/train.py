"""`gymserve train -c TRAIN.yaml [key=value ...]`: GRPO/GDPO with TRL's GRPOTrainer on gymserve rollouts."""
from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-c", "--config", required=True, help="training YAML (see deploy/train/smoke_cpu.yaml)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, dotted for nesting (grpo.max_steps=4)")
    parser.add_argument("--head", default=None, help="head URL (overrides head_url)")


def run(args: argparse.Namespace) -> int:
    from trainer.config import TrainConfigError, load_config
    from trainer.train import train
    from trainer.weight_sync import WeightSyncError

    overrides = list(args.overrides) + ([f"head_url={args.head}"] if args.head else [])
    try:
        config = load_config(args.config, overrides)
        result = train(config)
    except TrainConfigError as exc:
        print(f"gymserve train: {exc}", file=sys.stderr)
        return 2
    except WeightSyncError as exc:  # a push refused or a failed logprob check: never go on off-policy
        print(f"gymserve train: weight sync: {exc}", file=sys.stderr)
        return 1
    print(f"trained {result['global_step']} steps (mean loss {result['training_loss']:.6f}); "
          f"metrics: {result['metrics']}; plot: {result['plot']}; model: {result['final_model']}; "
          f"policy server weights_version: {result['weights_version']}")
    return 0
