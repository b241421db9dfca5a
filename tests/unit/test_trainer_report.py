"""`trainer.report.write_report`: a self-contained HTML report of a run (no script, no fetches)."""
from __future__ import annotations

import json
import re

from tests.integration.browser import DomIndex
from trainer.report import summarize, write_report, write_training_report


def _rollout(agent: str, reward: float | None, kind: str | None = None) -> dict:
    record = {"agent_ref": {"type": "responses_api_agents", "name": agent}, "reward": reward}
    if kind:
        record.update(mask_sample=True, failure_kind=kind, failure_reason="x")
    return record


RECORDS = ([_rollout("math", 1.0)] * 6 + [_rollout("math", 0.0)] * 2 + [_rollout("math", None, "timeout")] * 3
           + [_rollout("code", 0.25), _rollout("code", 0.75), _rollout("code", None, "sandbox"),
              _rollout("code", None, "crash"), {"reward": 1.0}])


def test_summary_per_environment():
    s = summarize(RECORDS)
    assert set(s) == {"math", "code", "<no agent_ref>"}
    assert (s["math"]["judged"], s["math"]["masked"], s["math"]["reward_mean"]) == (8, 3, 0.75)
    assert s["math"]["failures"] == {"timeout": 3}
    assert s["code"]["failures"] == {"crash": 1, "sandbox": 1} and s["code"]["reward_mean"] == 0.5
    assert {(b["lo"], b["hi"]): b["count"] for b in s["math"]["bins"] if b["count"]} == \
        {(-0.25, 0.0): 2, (0.9, 1.0): 6}


def test_report_is_self_contained_html(tmp_path):
    training = [{"step": i, "reward": 0.1 * i, "kl": 0.01 * i, "loss": 1.0} for i in range(1, 6)] + [{"loss": 2}]
    path = write_report(RECORDS, tmp_path / "run_report.html", title="my run <1>", training=training)
    text = path.read_text()
    assert "<script" not in text and not re.search(r'(src|href)="', text)  # nothing to load
    assert "my run &lt;1&gt;" in text
    dom = DomIndex(text)
    math_card = dom.find("div", data_env="math")[0]
    assert [el.text for el in dom.within(math_card, data_field="*")] == ["8", "0.75", "3"]
    assert "timeout" in math_card.text and len(dom.within(math_card, "svg")) == 1
    bars = dom.within(math_card, "rect")
    # the first bin drawn holds the rewards of 0: "≤0", not "-0.25–0"
    assert sorted(b.text for b in bars if not b.text.endswith(": 0")) == ["0.9–1: 6", "≤0: 2"]
    ticks = [t.text for t in dom.within(math_card, "text") if t.attrs.get("class") == "tick"]
    assert "≤0" in ticks and "-0.25–0" not in ticks
    # 11 bins in 384 px: every other bin labelled, so "0.2–0.3" and "0.3–0.4" do not run into each other
    assert "0.1–0.2" in ticks and "0.2–0.3" not in ticks
    assert len(dom.within(dom.by_id("training"), "polyline")) == 2  # reward and KL curves
    assert not list(tmp_path.glob("*.tmp"))


def test_report_without_judged_rollouts(tmp_path):
    text = write_report([_rollout("x", None, "upstream")], tmp_path / "r.html").read_text()
    assert "no judged rollouts" in text and "upstream" in text and 'id="training"' not in text


def test_training_report_reads_metrics_jsonl(tmp_path):
    lines = [json.dumps({"step": i, "reward": 0.2 * i, "kl": 0.01 * i}) for i in range(1, 4)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines + ["{torn"]) + "\n")
    path = write_training_report(tmp_path, [_rollout("math", 1.0)])
    dom = DomIndex(path.read_text())
    assert path == tmp_path / "report.html"
    assert len(dom.within(dom.by_id("training"), "polyline")) == 2 and dom.find("div", data_env="math")


def test_training_report_and_plot_draw_environments_components_mismatch_and_eval(tmp_path):
    """A blended GDPO run: one curve per environment, reward components apart, the mismatch metrics,
    and the evaluation reward (its own metrics.jsonl line at the same step) on the reward chart."""
    from trainer.step_log import plot

    lines = [{"step": i, "reward": 0.1 * i, "kl": 0.01, "reward/math_simple_agent": 0.2 * i,
              "reward/mcqa_simple_agent": 0.05 * i, "rewards/reward_format/mean": 0.5,
              "rewards/reward_correct/mean": 0.1 * i, "gen_kl_error": 1e-6 * i, "policy_kl_error": 1e-6,
              "js_divergence_error": 1e-7, "token_mult_prob_error": 1.0} for i in range(1, 5)]
    lines += [{"step": 2, "eval_reward": 0.3}, {"step": 4, "eval_reward": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    text = write_training_report(tmp_path, []).read_text()
    dom = DomIndex(text)
    cards = {dom.within(card, "h3")[0].text: card for card in dom.within(dom.by_id("training"), "div", **{"class": "card"})}
    assert set(cards) == {"reward by step", "reward by environment", "reward components", "KL by step",
                          "sampler/trainer mismatch"}
    assert "eval reward" in cards["reward by step"].text
    assert len(dom.within(cards["reward by step"], "polyline")) == 1  # reward; eval: 2 steps of 4 -> points
    assert all(env in cards["reward by environment"].text for env in ("math_simple_agent", "mcqa_simple_agent"))
    assert len(dom.within(cards["reward components"], "polyline")) == 2
    assert len(dom.within(cards["sampler/trainer mismatch"], "polyline")) == 3
    assert plot(tmp_path / "metrics.jsonl", tmp_path / "reward.png").stat().st_size > 10_000
