"""Excerpts of NeMo RL (Apache-2.0) that the NeMo RL adapter's contract tests run against, because
NeMo RL is not installable from the package index. Read from github.com/NVIDIA-NeMo/RL at commit
7ea279abfbeb698b092856d0dab61e7cf39bc909 (main, package version 0.6.0 there; 2026-08-22) and tag
v0.7.0. Only what the adapter touches is kept, unchanged in behaviour:

- `nemo_rl/environments/interfaces.py` EnvironmentReturn (`rewards: Tensor | dict[str, Tensor]` on
  main, `rewards: Tensor` on v0.7.0);
- `nemo_rl/environments/utils.py` register_env / create_env (hydra's get_object -> importlib);
- `nemo_rl/distributed/ray_actor_environment_registry.py` get_actor_python_env (ValueError for a
  class missing from ACTOR_ENVIRONMENT_REGISTRY);
- `nemo_rl/experience/rollouts.py` calculate_rewards' merge of the per-sample rewards and
  run_multi_turn_rollout's reward accumulation of each version (metadata of terminated samples
  is dropped);
- `nemo_rl/evals/eval.py`'s call `env.step.remote(to_env, batch["extra_env_info"], True)` then
  `rewards.tolist()`.
`write_package(root, version)` writes them as an importable `nemo_rl` package.
"""
from __future__ import annotations

from pathlib import Path

COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"

_INTERFACES = '''
from typing import Any, NamedTuple
from torch import Tensor


class EnvironmentReturn(NamedTuple):
    observations: list[dict[str, str]]
    metadata: list[Any]
    next_stop_strings: list[list[str] | None] | list[None]
    rewards: {rewards}
    terminateds: Tensor
    answers: list[str | None] | None
'''

_VIRTUAL_CLUSTER = '''
import sys


class PY_EXECUTABLES:
    SYSTEM = sys.executable
'''

_ACTOR_REGISTRY = '''
from nemo_rl.distributed.virtual_cluster import PY_EXECUTABLES

ACTOR_ENVIRONMENT_REGISTRY: dict[str, str] = {
    "nemo_rl.environments.math_environment.MathEnvironment": PY_EXECUTABLES.SYSTEM,
}


def get_actor_python_env(actor_class_fqn: str) -> str:
    if actor_class_fqn in ACTOR_ENVIRONMENT_REGISTRY:
        return ACTOR_ENVIRONMENT_REGISTRY[actor_class_fqn]
    else:
        raise ValueError(f"No actor environment registered for {actor_class_fqn}.")
'''

_UTILS = '''
import importlib
import os

from nemo_rl.distributed.ray_actor_environment_registry import get_actor_python_env

ENV_REGISTRY = {
    "math": {"actor_class_fqn": "nemo_rl.environments.math_environment.MathEnvironment"},
}


def get_object(fqn):
    module, _, name = fqn.rpartition(".")
    return getattr(importlib.import_module(module), name)


def create_env(env_name, env_config):
    assert env_name in ENV_REGISTRY, f"Env name {env_name} is not registered in ENV_REGISTRY."
    actor_class_fqn = ENV_REGISTRY[env_name]["actor_class_fqn"]
    actor_class = get_object(actor_class_fqn)
    actor_py_exec = get_actor_python_env(actor_class_fqn)
    return actor_class.options(
        runtime_env={"py_executable": actor_py_exec, "env_vars": {**dict(os.environ)}}
    ).remote(env_config)


def register_env(env_name, actor_class_fqn):
    if env_name in ENV_REGISTRY:
        raise ValueError(f"Env name {env_name} already registered")
    ENV_REGISTRY[env_name] = {"actor_class_fqn": actor_class_fqn}
'''

_ROLLOUTS = '''
import torch

from nemo_rl.environments.interfaces import EnvironmentReturn


def get_keys_from_message_log(message_log, keys):
    return [{k: msg[k] for k in keys if k in msg} for msg in message_log]


def merge_step_result(result):
    """calculate_rewards' loop and stacking for one environment's step result."""
    env_observations, metadata, next_stop_strings, task_rewards, terminateds, answers = result
    n = len(terminateds)
    if isinstance(task_rewards, dict):
        rewards = {name: torch.stack([task_rewards[name][i] for i in range(n)]) for name in task_rewards}
    elif n > 0 and isinstance(task_rewards[0], torch.Tensor):
        rewards = torch.stack([task_rewards[i] for i in range(n)])
    else:
        rewards = torch.tensor([task_rewards[i] for i in range(n)])
    return EnvironmentReturn(observations=env_observations, metadata=metadata,
                             next_stop_strings=next_stop_strings, rewards=rewards,
                             terminateds=torch.tensor([terminateds[i] for i in range(n)]), answers=answers)


def accumulate(env_output, batch_size):
    """run_multi_turn_rollout's single-turn reward accumulation into the batch (main: dict rewards
    to `reward/<name>` keys; v0.7.0: a (B, K) tensor summed, components as `reward1..K`)."""
    batch = {"extra_env_info": [None] * batch_size}
    total_rewards = torch.zeros(batch_size, dtype=torch.float32)
    if isinstance(env_output.rewards, dict):
        for name, r in env_output.rewards.items():
            batch[name] = torch.zeros(batch_size, dtype=torch.float32) + r
        total_rewards += sum(env_output.rewards.values())
    elif env_output.rewards.ndim >= 2:
        total_rewards += env_output.rewards.sum(dim=1)
        for i in range(env_output.rewards.shape[1]):
            batch[f"reward{i + 1}"] = env_output.rewards[:, i].clone()
    else:
        total_rewards += env_output.rewards
    done = env_output.terminateds.bool()
    for i in torch.where(~done)[0].tolist():  # only continuing samples keep their metadata
        if env_output.metadata[i] is not None:
            batch["extra_env_info"][i] = env_output.metadata[i]
    batch["total_reward"] = total_rewards
    return batch
'''

VERSIONS = {"main": "Tensor | dict[str, Tensor]", "v0.7.0": "Tensor"}


def write_package(root: Path, version: str) -> Path:
    files = {
        "nemo_rl/__init__.py": "",
        "nemo_rl/distributed/__init__.py": "",
        "nemo_rl/distributed/virtual_cluster.py": _VIRTUAL_CLUSTER,
        "nemo_rl/distributed/ray_actor_environment_registry.py": _ACTOR_REGISTRY,
        "nemo_rl/environments/__init__.py": "",
        "nemo_rl/environments/interfaces.py": _INTERFACES.replace("{rewards}", VERSIONS[version]),
        "nemo_rl/environments/utils.py": _UTILS,
        "nemo_rl/experience/__init__.py": "",
        "nemo_rl/experience/rollouts.py": _ROLLOUTS,
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
