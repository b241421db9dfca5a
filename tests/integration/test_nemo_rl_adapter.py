"""NeMo RL adapter against excerpts of NeMo RL's own code (tests/integration/nemo_rl_excerpts.py,
commit 7ea279abfbeb698b092856d0dab61e7cf39bc909 and v0.7.0) and real resource servers."""
from __future__ import annotations

import importlib
import sys

import pytest

from tests.integration._trainer_stack import small_stack
from tests.integration.nemo_rl_excerpts import COMMIT, write_package


@pytest.fixture(scope="module")
def stack():
    with small_stack([("resources/exact_match", "exact_match", []),
                      ("resources/math_multi_reward", "math_multi_reward", [])]) as (head, procs):
        yield head, procs


@pytest.fixture(params=["main", "v0.7.0"])
def nemo_rl(request, tmp_path, monkeypatch):
    """An importable `nemo_rl` made of the excerpts for one NeMo RL version."""
    write_package(tmp_path, request.param)
    _forget_nemo_rl()
    monkeypatch.syspath_prepend(str(tmp_path))
    yield request.param
    _forget_nemo_rl()


def _forget_nemo_rl() -> None:
    for name in [m for m in sys.modules if m == "nemo_rl" or m.startswith("nemo_rl.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


ANSWER_42 = "<think>\nadd\n</think>\n<answer>\n42\n</answer>"  # math_multi_reward: every component 1


def _log(question: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": question, "token_ids": [1]},
            {"role": "assistant", "content": answer, "token_ids": [2]}]


def _to_env(logs: list[list[dict]]) -> list[list[dict]]:
    rollouts = importlib.import_module("nemo_rl.experience.rollouts")
    return [rollouts.get_keys_from_message_log(log, ["role", "content"]) for log in logs]


def test_commit_cited():
    assert len(COMMIT) == 40


def test_registration_create_env_accepts(nemo_rl):
    """register_env alone leaves create_env's get_actor_python_env raising; register() adds both."""
    from trainer.adapters import nemo_rl as adapter

    utils = importlib.import_module("nemo_rl.environments.utils")
    registry = importlib.import_module("nemo_rl.distributed.ray_actor_environment_registry")
    utils.register_env("plain", adapter.ACTOR_FQN)
    with pytest.raises(ValueError, match="No actor environment registered"):
        registry.get_actor_python_env(adapter.ACTOR_FQN)
    adapter.register("gymserve_math")
    assert utils.ENV_REGISTRY["gymserve_math"]["actor_class_fqn"] == adapter.ACTOR_FQN
    assert registry.get_actor_python_env(adapter.ACTOR_FQN) == sys.executable
    assert utils.get_object(adapter.ACTOR_FQN) is adapter.GymserveEnvironment


def test_training_step_through_nemo_rl_merge(stack, nemo_rl):
    from trainer.adapters.nemo_rl import GymserveEnvironmentImpl

    head, _ = stack
    rollouts = importlib.import_module("nemo_rl.experience.rollouts")
    interfaces = importlib.import_module("nemo_rl.environments.interfaces")
    env = GymserveEnvironmentImpl({"head_url": head.url, "resource_server": "exact_match"})
    logs = [_log("capital?", "Paris"), _log("capital?", "Rome")]
    result = env.step(_to_env(logs), [{"ground_truth": "Paris"}, {"expected_answer": "Paris"}])
    assert isinstance(result, interfaces.EnvironmentReturn)
    merged = rollouts.merge_step_result(result)
    batch = rollouts.accumulate(merged, 2)
    assert batch["total_reward"].tolist() == [1.0, 0.0] and result.answers == ["Paris", "Rome"]


def test_eval_step_third_argument(stack, nemo_rl):
    """nemo_rl/evals/eval.py: env.step(to_env, extra_env_info, True) then rewards.tolist()."""
    from trainer.adapters.nemo_rl import GymserveEnvironmentImpl

    _, procs = stack
    env = GymserveEnvironmentImpl({"verify_url": procs["math_multi_reward"].url,
                                   "reward_components": ["correctness", "format"]})
    result = env.step(_to_env([_log("40 + 2?", ANSWER_42)]), [{"expected_answer": "42"}], True)
    assert result.rewards.tolist() == [pytest.approx(3.0)] and result.answers == [ANSWER_42]


def test_multi_reward_in_the_installed_format(stack, nemo_rl):
    from trainer.adapters.nemo_rl import GymserveEnvironmentImpl, detect_reward_format

    _, procs = stack
    reply = procs["math_multi_reward"].post("/verify", json={
        "responses_create_params": {"input": [{"role": "user", "content": "1+1"}]},
        "response": {"output": [{"type": "message", "role": "assistant",
                                 "content": [{"type": "output_text", "text": "\\boxed{2}"}]}]},
        "expected_answer": "2"}).json()
    names = sorted(reply["reward_components"])
    rollouts = importlib.import_module("nemo_rl.experience.rollouts")
    env = GymserveEnvironmentImpl({"verify_url": procs["math_multi_reward"].url, "reward_components": names})
    result = env.step(_to_env([_log("1+1", "\\boxed{2}"), _log("1+1", "3")]), [{"expected_answer": "2"}] * 2)
    batch = rollouts.accumulate(rollouts.merge_step_result(result), 2)
    if nemo_rl == "main":
        assert detect_reward_format() == "dict"
        assert sorted(result.rewards) == [f"reward/{n}" for n in names]
        assert [batch[f"reward/{n}"][0].item() for n in names] == pytest.approx(
            [reply["reward_components"][n] for n in names])
        assert batch["total_reward"][0].item() == pytest.approx(reply["reward"])
    else:
        assert detect_reward_format() == "tensor"
        assert tuple(result.rewards.shape) == (2, len(names))
        assert [batch[f"reward{k + 1}"][0].item() for k in range(len(names))] == pytest.approx(
            [reply["reward_components"][n] for n in names])
        assert batch["total_reward"][0].item() == pytest.approx(reply["reward"])


def test_masked_verify_fails_the_step_by_default(stack, nemo_rl):
    """NeMo RL drops a terminated sample's metadata: a mask there would be lost, so the step raises."""
    from trainer.adapters.nemo_rl import GymserveEnvironmentImpl, VerifyFailed

    _, procs = stack
    env = GymserveEnvironmentImpl({"verify_url": procs["exact_match"].url})
    with pytest.raises(VerifyFailed, match="1 of 2 samples could not be verified"):
        env.step(_to_env([_log("q", "x"), _log("q", "y")]), [{}, {"expected_answer": "y"}])


def test_masked_verify_counted_and_logged_with_on_failure_count(stack, nemo_rl, caplog):
    from trainer.adapters.nemo_rl import GymserveEnvironmentImpl

    _, procs = stack
    rollouts = importlib.import_module("nemo_rl.experience.rollouts")
    env = GymserveEnvironmentImpl({"verify_url": procs["exact_match"].url, "on_failure": "count"})
    with caplog.at_level("WARNING", logger="gymserve.nemo_rl"):
        result = env.step(_to_env([_log("q", "x"), _log("q", "y")]), [{}, {"expected_answer": "y"}])
    batch = rollouts.accumulate(rollouts.merge_step_result(result), 2)
    assert batch["total_reward"].tolist() == [0.0, 1.0]
    assert batch["extra_env_info"] == [None, None]  # what NeMo RL keeps of the mask: nothing
    assert env.fabricated_zeros == 1 and "scored 0 without a verdict" in caplog.text
    _, metrics = env.global_post_process_and_metrics({"total_reward": batch["total_reward"]})
    assert metrics["fabricated_zeros"] == 1


def test_bad_config_names_the_field():
    from trainer.adapters.nemo_rl import GymserveEnvironmentImpl

    with pytest.raises(ValueError, match="on_failure"):
        GymserveEnvironmentImpl({"verify_url": "http://127.0.0.1:1", "on_failure": "zero"})
    with pytest.raises(ValueError, match="reward_format"):
        GymserveEnvironmentImpl({"verify_url": "http://127.0.0.1:1", "reward_format": "list"})


@pytest.mark.slow
@pytest.mark.parametrize("nemo_rl", ["main"], indirect=True)
def test_create_env_starts_the_ray_actor(stack, nemo_rl):
    """NeMo RL's create_env path end to end: registry lookup, runtime_env py_executable, remote step."""
    import shutil
    import tempfile

    import ray

    from trainer.adapters.nemo_rl import register

    head, _ = stack
    utils = importlib.import_module("nemo_rl.environments.utils")
    register("gymserve_exact")
    temp = tempfile.mkdtemp(prefix="gsray")  # short: Ray's socket paths must fit in 107 characters
    ray.init(num_cpus=1, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False, _temp_dir=temp)
    try:
        env = utils.create_env("gymserve_exact", {"head_url": head.url, "resource_server": "exact_match"})
        result = ray.get(env.step.remote(_to_env([_log("q", "tac")]), [{"expected_answer": "tac"}]), timeout=120)
        assert result.rewards.tolist() == [1.0]
        evaluated = ray.get(env.step.remote(_to_env([_log("q", "tic")]), [{"expected_answer": "tac"}], True),
                            timeout=60)
        assert evaluated.rewards.tolist() == [0.0]
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
