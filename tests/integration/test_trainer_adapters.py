"""Framework adapters against real servers: verl compute_score, OpenRLHF /get_reward on the head;
exact_match and math_multi_reward resource servers (NeMo RL: test_nemo_rl_adapter.py)."""
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
