"""Framework adapters against real servers: NeMo RL env actor (local Ray), verl compute_score,
OpenRLHF /get_reward on the head; exact_match and math_multi_reward resource servers."""
from __future__ import annotations

import httpx
import pytest

from gymserve.testing import ServerProcess
from tests.integration._trainer_stack import small_stack


@pytest.fixture(scope="module")
def stack():
    with small_stack([("resources/exact_match", "exact_match", []),
                      ("resources/math_multi_reward", "math_multi_reward", [])]) as (head, procs):
        yield head, procs


def _log(question: str, answer: str) -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


def test_nemo_rl_env_step_and_metrics(stack):
    from trainer.adapters.nemo_rl import EnvironmentReturn, GymserveEnvironmentImpl

    head, procs = stack
    env = GymserveEnvironmentImpl({"head_url": head.url, "resource_server": "exact_match"})
    result = env.step([_log("capital?", "Paris"), _log("capital?", "Rome")],
                      [{"expected_answer": "Paris"}, {"expected_answer": "Paris"}])
    assert isinstance(result, EnvironmentReturn)
    assert list(result._fields) == ["observations", "metadata", "next_stop_strings", "rewards", "terminateds",
                                    "answers"]
    assert result.rewards.tolist() == [1.0, 0.0] and result.terminateds.tolist() == [True, True]
    assert result.answers == ["Paris", "Rome"] and result.next_stop_strings == [None, None]
    assert result.observations[0]["role"] == "environment"
    assert result.metadata[1]["expected_answer"] == "Paris" and result.metadata[1]["mask_sample"] is False
    # a row the environment cannot judge is a 400 from /verify/batch items -> masked per item
    bad = env.step([_log("q", "x")], [{}])
    assert bad.metadata[0]["mask_sample"] is True and bad.rewards.tolist() == [0.0]
    import torch

    batch = {"extra_env_info": result.metadata + bad.metadata, "loss_multiplier": torch.ones(3),
             "total_reward": torch.tensor([1.0, 0.0, 0.0])}
    batch, metrics = env.global_post_process_and_metrics(batch)
    assert batch["loss_multiplier"].tolist() == [1.0, 1.0, 0.0]
    assert metrics["accuracy"] == pytest.approx(0.5) and metrics["num_masked"] == 1


def test_nemo_rl_multi_reward_shape(stack):
    from trainer.adapters.nemo_rl import GymserveEnvironmentImpl

    head, procs = stack
    comps = procs["math_multi_reward"].post("/verify", json={
        "responses_create_params": {"input": [{"role": "user", "content": "1+1"}]},
        "response": {"output": [{"type": "message", "role": "assistant",
                                 "content": [{"type": "output_text", "text": "\\boxed{2}"}]}]},
        "expected_answer": "2"}).json()["reward_components"]
    names = sorted(comps)
    env = GymserveEnvironmentImpl({"verify_url": procs["math_multi_reward"].url, "reward_components": names})
    result = env.step([_log("1+1", "\\boxed{2}"), _log("1+1", "3")], [{"expected_answer": "2"}] * 2)
    assert tuple(result.rewards.shape) == (2, len(names))
    assert result.rewards[0].tolist() == pytest.approx([comps[n] for n in names])


@pytest.mark.slow
def test_nemo_rl_env_as_ray_actor(stack):
    """NeMo RL instantiates the env as a Ray actor via register_env's class path."""
    import importlib

    import ray

    head, _ = stack
    module, _, name = "trainer.adapters.nemo_rl.GymserveEnvironment".rpartition(".")
    actor_class = getattr(importlib.import_module(module), name)
    import shutil
    import tempfile

    temp = tempfile.mkdtemp(prefix="gsray")  # short: Ray's socket paths must fit in 107 characters
    ray.init(num_cpus=1, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False, _temp_dir=temp)
    try:
        actor = actor_class.options(num_gpus=0).remote({"head_url": head.url, "resource_server": "exact_match"})
        result = ray.get(actor.step.remote([_log("q", "tac")], [{"expected_answer": "tac"}]), timeout=120)
        assert result.rewards.tolist() == [1.0]
        _, metrics = ray.get(actor.global_post_process_and_metrics.remote(
            {"total_reward": result.rewards, "extra_env_info": result.metadata}), timeout=60)
        assert metrics["accuracy"] == 1.0
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def test_verl_compute_score(stack, monkeypatch):
    from trainer.adapters import verl

    head, procs = stack
    monkeypatch.setenv("GYMSERVE_VERIFY_URL", procs["exact_match"].url)
    assert verl.compute_score("exact_match", "Paris", "Paris") == 1.0
    assert verl.compute_score("exact_match", "Lyon", "Paris", {"question": "capital?"}) == 0.0
    monkeypatch.delenv("GYMSERVE_VERIFY_URL")
    monkeypatch.setenv("GYMSERVE_HEAD_URL", head.url)
    result = verl.compute_score("math_multi_reward", "\\boxed{4}", "4")
    assert isinstance(result, dict) and result["score"] == pytest.approx(
        sum(v for k, v in result.items() if k != "score"))
    with pytest.raises(Exception, match="exact_match|expected_answer"):
        verl.compute_score("exact_match", "x", {"no_answer": 1})


def test_openrlhf_get_reward_on_the_head(tmp_path):
    with ServerProcess("head", "openrlhf_environment=exact_match") as head:
        with ServerProcess("resources/exact_match", name="exact_match", env={"GYMSERVE_HEAD_URL": head.url}):
            from tests.integration._trainer_stack import wait_registered

            wait_registered(head.url, ["exact_match"])
            reply = httpx.post(f"{head.url}/get_reward", json={
                "query": ["Q: capital? A: Paris", "Q: capital? A: Rome", "Q: x? A: y"],
                "prompts": ["Q: capital? A: ", "Q: capital? A: ", "Q: x? A: "],
                "labels": ["Paris", "Paris", '{"wrong_field": 1}']}, timeout=60)
            assert reply.status_code == 200, reply.text
            body = reply.json()
            assert body["rewards"] == [1.0, 0.0, 0.0] and body["scores"] == body["rewards"]
            assert body["extra_logs"]["mask_sample"] == [False, False, True]
            assert body["extra_logs"]["num_masked"] == 1
            bad = httpx.post(f"{head.url}/get_reward", json={"query": "not a list"}, timeout=30)
            assert bad.status_code == 400 and "query" in bad.json()["detail"]
            mismatch = httpx.post(f"{head.url}/get_reward", json={"query": ["a"], "prompts": ["a", "b"]}, timeout=30)
            assert mismatch.status_code == 400 and "prompts" in mismatch.json()["detail"]
