"""The dashboard's pieces without servers: metrics parsing, percentiles, windows over samples,
reward bins, the training log and the trainer's feed (against a real HTTP server that is down
or answers 500: training must not notice)."""
from __future__ import annotations

import math
import socket

import pytest
from prometheus_client import generate_latest

from gateway.series import History, Sample, parse_sample, quantile, window
from gateway.training import TrainingLog, TrainingStep
from services.core.metrics import Metrics, bins_from_buckets, reward_bins
from trainer.training_feed import TrainingFeed, step_record


def _metrics_text(rewards: list[float], latencies: list[float], failures: list[str]) -> str:
    m = Metrics("t")
    for r in rewards:
        m.reward(r)
    for s in latencies:
        m.requests.labels(method="POST", path="/verify", status="200").inc()
        m.latency.labels(method="POST", path="/verify").observe(s)
    m.requests.labels(method="GET", path="/ready", status="200").inc(50)  # probes are left out
    m.latency.labels(method="GET", path="/ready").observe(9.0)
    for kind in failures:
        m.failure(kind)
    return generate_latest(m.registry).decode()


def test_parse_sample_reads_rewards_latency_and_failures():
    s = parse_sample(_metrics_text([1, 0, 1, -0.5], [0.004, 0.004, 0.2], ["timeout", "timeout", "crash"]), t=5.0)
    assert s.t == 5.0 and s.requests_total == 3 and s.latency_count == 3
    assert s.reward_count == 4 and s.reward_sum == pytest.approx(1.5)  # negative rewards keep their sum
    assert s.failures == {"timeout": 2, "crash": 1} and s.failures_total == 3
    assert s.latency_buckets[math.inf] == 3 and s.latency_buckets[0.005] == 2


def test_quantile_interpolates_like_prometheus():
    buckets = [(0.1, 50.0), (0.2, 100.0), (math.inf, 100.0)]
    assert quantile(0.5, buckets) == pytest.approx(0.1)
    assert quantile(0.75, buckets) == pytest.approx(0.15)
    assert quantile(0.99, [(1.0, 0.0), (math.inf, 10.0)]) == 1.0  # +Inf answers its lower edge
    assert quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None


def test_window_and_restart():
    old = Sample(t=0, requests_total=10, reward_sum=3, reward_count=6, latency_buckets={0.1: 10, math.inf: 10})
    new = Sample(t=10, requests_total=30, reward_sum=13, reward_count=16, latency_buckets={0.1: 10, math.inf: 30})
    w = window(old, new)
    assert w.requests_per_s == 2.0 and w.reward_mean == 1.0 and w.latency_ms(0.5) == 100.0
    restarted = Sample(t=20, requests_total=4, reward_sum=1, reward_count=2, latency_buckets={0.1: 4, math.inf: 4})
    w = window(new, restarted)  # counters began again: the new values are the growth
    assert w.requests == 4 and w.reward_mean == 0.5


def test_history_keeps_one_sample_per_gap_and_the_last_minute():
    h = History(min_gap_s=1.0)
    for i in range(50):  # 0.1 s apart: at most one kept per second, the newest always last
        h.add(Sample(t=i * 0.1, requests_total=i))
    assert 5 <= len(h.samples) <= 7 and h.latest.requests_total == 49
    for i in range(200):
        h.add(Sample(t=10 + i, requests_total=100 + 2 * i))
    recent = h.recent(60)
    assert recent.seconds == 60 and recent.requests_per_s == 2.0
    series = h.series(60)
    assert len(series) == len(h.samples) - 1 and series[-1][1].requests_per_s == 2.0
    h.add(Sample(t=500, requests_total=1))  # a restart clears what came before
    assert len(h.samples) == 1 and h.recent() is None


def test_reward_bins_match_the_live_histogram():
    rewards = [0, 0, 1, 1, 1, 0.55, -20, 30]
    m = Metrics("t")
    for r in rewards:
        m.reward(r)
    live = bins_from_buckets(parse_sample(generate_latest(m.registry).decode(), 0).reward_buckets)
    assert reward_bins(rewards) == live
    counts = {(b["lo"], b["hi"]): b["count"] for b in live if b["count"]}
    assert counts == {(None, -10.0): 1, (-0.25, 0.0): 2, (0.5, 0.6): 1, (0.9, 1.0): 3, (10.0, None): 1}
    assert live[0]["lo"] is None and live[-1]["hi"] is None
    assert reward_bins([]) == []


def test_training_log_orders_replaces_and_bounds():
    log = TrainingLog(max_runs=2, max_steps=3)
    for step in (2, 1, 3, 1):
        log.add(TrainingStep(run="a", step=step, reward=step / 10))
    log.add(TrainingStep(run="b", step=0))
    assert [r["step"] for r in log.records("a")] == [1, 2, 3] and log.latest_run() == "b"
    log.add(TrainingStep(run="a", step=3, kl=0.5, reward_components={"x": 1.0}))  # adds to step 3
    assert log.records("a")[-1]["reward"] == 0.3 and log.records("a")[-1]["kl"] == 0.5
    log.add(TrainingStep(run="a", step=4))
    assert [r["step"] for r in log.records("a")] == [1, 3, 4]  # oldest inserted dropped (step 2)
    log.add(TrainingStep(run="c", step=0))
    assert log.runs() == ["a", "c"]
    with pytest.raises(ValueError, match="kl"):
        TrainingStep(step=1, kl=float("nan"))


def test_step_record_maps_trl_logs():
    trl = {"step": 7, "loss": 0.1, "reward": 0.5, "reward_std": 0.2, "kl": 0.01, "learning_rate": 1e-6,
           "rewards/accuracy/mean": 0.4, "rewards/accuracy/std": 0.3, "rewards/format": 0.1,
           "completions/mean_length": 12.0, "grad_norm": float("nan"), "policy_version": 3}
    body = step_record(trl, run="r")
    assert body == {"run": "r", "step": 7, "loss": 0.1, "reward": 0.5, "reward_std": 0.2, "kl": 0.01,
                    "learning_rate": 1e-6, "reward_components": {"accuracy": 0.4, "format": 0.1},
                    "policy_version": 3}
    TrainingStep.model_validate(body)  # what the head accepts
    assert step_record({"reward": 1.0}) is None and step_record({"step": True}) is None
    assert step_record({"step": 1, "reward": float("inf")}) == {"run": "default", "step": 1}


def test_step_record_carries_per_environment_rewards_and_mismatch_metrics():
    record = {"step": 2, "reward": 0.5, "reward/math_simple_agent": 0.75, "reward/mcqa_simple_agent": 0.25,
              "gen_kl_error": 2e-4, "token_mult_prob_error": 1.01, "js_divergence_error": float("nan")}
    body = step_record(record)
    assert body is not None
    assert body["env_rewards"] == {"math_simple_agent": 0.75, "mcqa_simple_agent": 0.25}
    assert body["mismatch"] == {"token_mult_prob_error": 1.01, "gen_kl_error": 2e-4}  # NaN left out
    log = TrainingLog()
    log.add(TrainingStep.model_validate(body))
    log.add(TrainingStep(step=2, mismatch={"policy_kl_error": 1e-4}))  # a later record of the step adds to it
    assert log.records()[0]["mismatch"] == {"token_mult_prob_error": 1.01, "gen_kl_error": 2e-4,
                                            "policy_kl_error": 1e-4}
    with pytest.raises(ValueError, match="mismatch.gen_kl_error"):
        TrainingStep(step=1, mismatch={"gen_kl_error": float("inf")})


def test_feed_never_blocks_or_raises_when_the_head_is_down():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    feed = TrainingFeed(f"http://127.0.0.1:{port}", timeout_s=0.5, max_pending=5)
    for step in range(50):  # a full queue drops records rather than making training wait
        feed.post({"step": step, "reward": 0.1})
    assert feed.flush(30)
    assert feed.sent == 0 and feed.dropped == 50
    feed.close()
    feed.post({"step": 99})  # after close: ignored, no error


def test_parse_sample_sums_judge_counters_over_judges():
    m = Metrics("env")
    m.judges.calls.labels(judge="a", outcome="ok").inc(3)
    m.judges.calls.labels(judge="b", outcome="timeout").inc()
    m.judges.cache_hits.labels(judge="a").inc(2)
    m.judges.failures.labels(judge="b", reason="timeout").inc()
    s = parse_sample(generate_latest(m.registry).decode(), t=1.0)
    assert s.judge == {"calls": 4.0, "cache_hits": 2.0, "failures": 1.0}
    assert parse_sample(generate_latest(Metrics("plain").registry).decode(), t=1.0).judge == {}
