"""`/aggregate_metrics` answers NeMo-Gym 0.7.0's `AggregateMetrics`: every metric we name equals
the one NeMo-Gym's own aggregation (`compute_aggregate_metrics`) computes from the same replies."""
from __future__ import annotations

import pytest

from gateway.nemo_gym import environment_server_name
from services.core.metrics_agg import aggregate_metrics

pytestmark = pytest.mark.timeout(1800)  # the first compat test may install NeMo-Gym (cached afterwards)

NEMO_AGGREGATE = """
from nemo_gym.reward_profile import compute_aggregate_metrics
print(json.dumps([compute_aggregate_metrics(case).model_dump() for case in data]))
"""

CASES = [
    # two tasks, three repeats, one masked rollout
    [{"_ng_task_index": t, "_ng_rollout_index": r, "reward": float((t + r) % 2)} for t in range(2) for r in range(3)]
    + [{"_ng_task_index": 1, "_ng_rollout_index": 3, "reward": 0.0, "mask_sample": True,
        "failure_kind": "timeout"}],
    # one repeat of four tasks with fractional rewards
    [{"_ng_task_index": t, "_ng_rollout_index": 0, "reward": v} for t, v in enumerate([0.25, 1.0, 0.0, 0.5])],
    # a single rollout
    [{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}],
    # every rollout masked: coverage only
    [{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 0.0, "mask_sample": True}],
]


def _close(ours: dict, theirs: dict, where: str) -> None:
    for key, value in ours.items():
        assert key in theirs, f"{where}: {key} is not a NeMo-Gym metric ({sorted(theirs)})"
        assert theirs[key] == pytest.approx(value), f"{where}: {key} {value} != NeMo-Gym's {theirs[key]}"


def test_aggregate_metrics_equal_nemo_gyms(nemo, workdir):
    theirs_all = nemo.python_json(NEMO_AGGREGATE, CASES, workdir)
    for i, (case, theirs) in enumerate(zip(CASES, theirs_all)):
        ours = aggregate_metrics({"verify_responses": case})
        assert ours["key_metrics"] == pytest.approx(theirs["key_metrics"]), f"case {i}"
        _close(ours["agent_metrics"], theirs["agent_metrics"], f"case {i} agent_metrics")
        assert [g["_ng_task_index"] for g in ours["group_level_metrics"]] == \
            [g["_ng_task_index"] for g in theirs["group_level_metrics"]], f"case {i}"
        for ours_group, theirs_group in zip(ours["group_level_metrics"], theirs["group_level_metrics"]):
            _close(ours_group, theirs_group, f"case {i} task {ours_group['_ng_task_index']}")
        assert len(ours["repeat_level_metrics"]) == len(theirs["repeat_level_metrics"]), f"case {i}"
        for ours_rep, theirs_rep in zip(ours["repeat_level_metrics"], theirs["repeat_level_metrics"]):
            _close(ours_rep, theirs_rep, f"case {i} repeat {ours_rep['_ng_rollout_index']}")
    # what NeMo-Gym's collector keeps: its own model validates our reply
    validated = nemo.python_json("""
from nemo_gym.config_types import AggregateMetrics
print(json.dumps(AggregateMetrics.model_validate(data).model_dump()))
""", aggregate_metrics({"verify_responses": CASES[0]}), workdir)
    assert validated["agent_metrics"]["mean/reward"] == pytest.approx(0.5)
    assert validated["key_metrics"]["coverage/masked_rollouts"] == 1


def test_environment_server_names_are_nemo_gyms(nemo, workdir):
    agents = [["math_simple_agent", "simple_agent"], ["workplace_assistant_simple_agent", "simple_agent"],
              ["my_agent", "multi_turn_agent"], ["simple_agent", "simple_agent"], ["judge", "simple_agent"]]
    theirs = nemo.python_json("""
from nemo_gym.global_config import legacy_environment_server_name
print(json.dumps([legacy_environment_server_name(a, t) for a, t in data]))
""", agents, workdir)
    assert [environment_server_name(a, t) for a, t in agents] == theirs
