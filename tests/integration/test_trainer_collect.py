"""`gymserve collect` and the routing client against real servers: head, exact_match,
simple_agent and the scripted `models/stub` model (a real HTTP server standing in for a
policy so rewards are deterministic; the policy itself is tested elsewhere)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from gymserve.testing import ServerProcess
from tests.integration._trainer_stack import small_stack, wait_registered
from trainer.client import RolloutClient, run_sync
from trainer.collect import collect, sibling

AGENT = "exact_match_simple_agent"


def _row(question: str, answer: str, agent: str | None = AGENT, script: list | None = None) -> dict:
    params: dict = {"input": [{"role": "user", "content": question}]}
    if script is not None:
        params["metadata"] = {"stub_script": json.dumps(script)}
    row = {"responses_create_params": params, "expected_answer": answer}
    if agent is not None:
        row["agent_ref"] = {"type": "responses_api_agents", "name": agent}
    return row


@pytest.fixture(scope="module")
def stack():
    agent_opts = ["resources_server=exact_match", "model_server=policy", "rollout_deadline_s=60"]
    with small_stack([("resources/exact_match", "exact_match", []),
                      ("models/stub", "policy", ["text=Paris"]),
                      ("agents/simple_agent", AGENT, agent_opts)]) as (head, procs):
        yield head, procs


def _lines(path: Path) -> list[dict]:
    text = path.read_text()
    assert text == "" or text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


async def test_collect_routes_repeats_failures_and_metrics(stack, tmp_path):
    head, _ = stack
    rows = [_row("Capital of France?", "Paris"), _row("Capital of Spain?", "Madrid"),
            _row("q", "x", agent="no_such_agent"), _row("q", "x", agent=None)]
    out = tmp_path / "out.jsonl"
    stats = await collect(rows, out, client=RolloutClient(head.url, concurrency=4), repeats=3)
    rollouts = _lines(out)
    failures = _lines(tmp_path / "out_failures.jsonl")
    assert stats.done == 12 and stats.failed == 6
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in rollouts) == \
        [(t, k) for t in (0, 1) for k in range(3)]
    for r in rollouts:
        assert r["reward"] == (1.0 if r["_ng_task_index"] == 0 else 0.0)
        assert r["response"]["output"], "the trajectory comes back"
    assert len(failures) == 6
    for f in failures:
        assert f["mask_sample"] is True and f["reward"] is None and f["failure_kind"] == "bad_request"
    unknown = [f for f in failures if f["_ng_task_index"] == 2]
    assert all("unknown agent 'no_such_agent'" in f["failure_reason"] for f in unknown)
    assert all("agent_ref" in f["failure_reason"] for f in failures if f["_ng_task_index"] == 3)
    metrics = json.loads((tmp_path / "out_metrics.json").read_text())
    agent = metrics["agents"][AGENT]
    assert agent["mean_reward"] == pytest.approx(0.5) and agent["pass@1"] == pytest.approx(0.5)
    assert agent["pass@3"] == pytest.approx(0.5)
    assert metrics["agents"]["no_such_agent"]["failures"] == {"bad_request": 3}
    assert metrics["run"]["rollouts"] == 12 and metrics["run"]["failed"] == 6


async def test_resume_skips_finished_and_repairs_torn_tail(stack, tmp_path):
    head, _ = stack
    rows = [_row("Capital of France?", "Paris"), _row("Capital of Italy?", "Rome")]
    out = tmp_path / "r.jsonl"
    await collect(rows, out, client=RolloutClient(head.url), repeats=2)
    first = _lines(out)
    kept = first[:2]
    out.write_text("".join(json.dumps(r) + "\n" for r in kept) + '{"torn": ')  # killed mid-line
    stats = await collect(rows, out, client=RolloutClient(head.url), repeats=2, resume=True)
    assert stats.skipped == 2 and stats.done == 2
    after = _lines(out)
    assert len(after) == 4
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in after) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert after[:2] == kept
    metrics = json.loads(sibling(out, "_metrics.json").read_text())
    assert metrics["agents"][AGENT]["num_samples"] == 4


@pytest.mark.timeout(60)
async def test_deadline_masks_slow_rollout(stack):
    head, _ = stack
    client = RolloutClient(head.url, deadline_s=1.5, retries=0)
    record = await client.run(_row("slow", "Paris", script=[{"sleep": 20, "text": "Paris"}]))
    assert record["mask_sample"] is True and record["reward"] is None
    assert record["failure_kind"] == "timeout"
    assert "rollout deadline of 1.5s exceeded" in record["failure_reason"], record["failure_reason"]


async def test_re_resolves_an_agent_that_moved(stack):
    head, procs = stack
    client = RolloutClient(head.url, retries=3)
    assert (await client.run(_row("Capital of France?", "Paris")))["reward"] == 1.0
    old = procs[AGENT]
    old.stop()
    moved = ServerProcess("agents/simple_agent", "resources_server=exact_match", "model_server=policy",
                          name=AGENT, env={"GYMSERVE_HEAD_URL": head.url}).start()
    procs[AGENT] = moved  # the fixture stops it
    assert moved.port != old.port
    wait_registered(head.url, [AGENT])
    record = await client.run(_row("Capital of France?", "Paris"))
    assert record["reward"] == 1.0, record.get("failure_reason")


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl_c", "sigterm"])
def test_cli_collect_stopped_by_a_signal_leaves_whole_lines(stack, tmp_path, sig, code):
    head, _ = stack
    rows_path = tmp_path / "rows.jsonl"
    rows = [_row("Capital of France?", "Paris")] * 2 + \
        [_row("slow", "Paris", script=[{"sleep": 30, "text": "Paris"}])] * 2
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cli.jsonl"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gymserve", "collect", "-i", str(rows_path), "-o", str(out),
                             "--head", head.url, "--concurrency", "4"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            # as from a terminal: a background job's shell (e.g. CI under `cmd &`) passes
                            # SIGINT down as ignored, and Python keeps it ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 2):
        time.sleep(0.2)
    proc.send_signal(sig)
    output = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == code, output
    finished = _lines(out)
    assert len(finished) == 2 and all(r["reward"] == 1.0 for r in finished)
    assert "resume" in output
    assert json.loads(sibling(out, "_metrics.json").read_text())["run"]["rollouts"] == 2


def test_cli_collect_names_its_head_and_why_rows_failed(stack, tmp_path):
    head, _ = stack
    rows = [_row("Capital of France?", "Paris")] + \
        [_row("q", "Paris", script=[{"status": 500, "error": "scripted model failure"}])] * 2 + \
        [_row("q", "Paris", agent="no_such_agent")]
    rows_path = tmp_path / "rows.jsonl"
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {**os.environ, "GYMSERVE_HEAD_URL": head.url}
    result = subprocess.run([sys.executable, "-m", "gymserve", "collect", "-i", str(rows_path), "-o",
                             str(tmp_path / "o.jsonl"), "--no-progress"], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"head: {head.url} (from $GYMSERVE_HEAD_URL)" in result.stdout
    groups = result.stdout.split("why rollouts failed (count, kind, reason):\n", 1)[1].splitlines()
    assert groups[0].startswith("  2 x upstream: ") and "scripted model failure" in groups[0], result.stdout
    assert groups[1].startswith("  1 x bad_request: ") and "no_such_agent" in groups[1], result.stdout


def test_cli_bad_input_names_the_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{not json\n')
    result = subprocess.run([sys.executable, "-m", "gymserve", "collect", "-i", str(bad), "-o",
                             str(tmp_path / "o.jsonl")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "bad.jsonl:2" in result.stderr


async def test_demo_runs_present_agents_and_skips_missing(stack, tmp_path, capsys):
    from rich.console import Console
    from rich.progress import Progress

    from gymserve.demo import REPO, print_table, run_demo

    head, _ = stack
    datasets = [REPO / "datasets/exact_match/example.jsonl", REPO / "datasets/mcqa/example.jsonl"]
    with Progress(disable=True) as progress:
        results = await run_demo(head.url, rows_per_env=2, max_output_tokens=16, repeats=1, out_dir=tmp_path,
                                 datasets=datasets, left_out={}, judges={}, progress=progress)
    by_env = {r["environment"]: r for r in results}
    assert by_env["exact_match"]["rollouts"] == 2 and by_env["exact_match"]["scored"] == 2
    assert by_env["exact_match"]["mean_reward"] == pytest.approx(0.5)  # the stub answers "Paris"
    assert "mcqa_simple_agent" in by_env["mcqa"]["reason"] and by_env["mcqa"]["rollouts"] == 0
    print_table(results, Console(width=200))
    out = capsys.readouterr().out
    assert "exact_match" in out and "mcqa_simple_agent not in the stack" in out
    assert len((tmp_path / "exact_match.jsonl").read_text().splitlines()) == 2


async def test_batch_deadline_cancels_stragglers_only(stack):
    head, _ = stack
    client = RolloutClient(head.url, concurrency=4, deadline_s=60, retries=0)
    rows = [_row("Capital of France?", "Paris"), _row("slow", "Paris", script=[{"sleep": 30, "text": "Paris"}]),
            _row("Capital of France?", "Paris")]
    quick, slow, quick_too = await client.run_many(rows, batch_deadline_s=4)
    assert quick["reward"] == 1.0 and quick_too["reward"] == 1.0
    assert slow["mask_sample"] is True and slow["reward"] is None and slow["failure_kind"] == "timeout"
    assert "batch deadline" in slow["failure_reason"]


def test_cli_collect_batch_deadline_masks_and_reports_stragglers(stack, tmp_path):
    head, _ = stack
    rows_path = tmp_path / "rows.jsonl"
    rows = [_row("Capital of France?", "Paris")] * 3 + [_row("slow", "Paris", script=[{"sleep": 30, "text": "Paris"}])]
    rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cut.jsonl"
    result = subprocess.run([sys.executable, "-m", "gymserve", "collect", "-i", str(rows_path), "-o", str(out),
                             "--head", head.url, "--concurrency", "4", "--batch-deadline-s", "8", "--no-progress"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "1 cut by the batch deadline" in result.stdout
    assert [r["reward"] for r in _lines(out)] == [1.0] * 3
    (failure,) = _lines(sibling(out, "_failures.jsonl"))
    assert failure["failure_kind"] == "timeout" and failure["mask_sample"] is True
    run = json.loads(sibling(out, "_metrics.json").read_text())["run"]
    assert run["cut_by_batch_deadline"] == 1 and run["batch_deadline_s"] == 8
    bad = subprocess.run([sys.executable, "-m", "gymserve", "collect", "-i", str(rows_path), "-o", str(out),
                          "--batch-deadline-s", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--batch-deadline-s" in bad.stderr


def test_trl_rollout_func_batch_deadline_masks_stragglers(stack):
    from trainer.trl import make_rollout_func, row_prompt

    head, _ = stack
    slow = _row("slow", "Paris", script=[{"sleep": 30, "text": "Paris"}])
    quick = _row("Capital of France?", "Paris")
    tokenizer = types.SimpleNamespace(eos_token_id=0)  # only used for the masked rollout's prompt ids
    records: list[dict] = []
    rollout = make_rollout_func(head.url, tokenizer, rows=[slow, quick], batch_deadline_s=4, retries=0,
                                on_records=records.extend)
    try:
        out = rollout([row_prompt(slow), row_prompt(quick)], None)
    finally:
        run_sync(rollout.client.aclose)
    assert rollout.stats["cut_by_batch_deadline"] == 1
    assert out["env_reward"][0] is None  # masked, not a reward of 0
    assert records[0]["failure_kind"] == "timeout" and records[1]["reward"] == 1.0


def test_trl_rollout_func_async_takes_prefetched_batches_and_reruns_stale_samples(stack):
    from trainer.trl import make_rollout_func, row_prompt

    head, _ = stack
    paris, madrid = _row("Capital of France?", "Paris"), _row("Capital of Spain?", "Madrid")
    tokenizer = types.SimpleNamespace(eos_token_id=0)
    records: list[dict] = []
    counts: list[dict] = []
    stale_once = {1: True}  # the first Madrid sample (task 1) taken from the queue is stale

    def is_stale(trainer, record):
        return stale_once.pop(record["_ng_task_index"], False)

    rollout = make_rollout_func(head.url, tokenizer, rows=[paris, madrid], retries=0, max_policy_lag=1,
                                on_records=records.extend, is_stale=is_stale,
                                on_stats=lambda trainer, c: counts.append(c))
    prompts = [row_prompt(paris), row_prompt(madrid)]
    try:
        assert rollout.prefetch([{"prompt": p} for p in prompts], None)
        assert not rollout.prefetch([{"prompt": p} for p in prompts], None)  # a repeated batch is not re-queued
        assert rollout.prefetch([{"prompt": prompts[0]}], None)  # the batch trained next + 1 ahead
        assert not rollout.prefetch([{"prompt": prompts[1]}], None)  # bounded: full
        rollout(prompts, None)
        rollout(prompts, None)  # not prefetched: collected now
    finally:
        run_sync(rollout.client.aclose)
    assert counts == [{"prefetch_hit": 1.0, "stale_dropped": 1.0}, {"prefetch_hit": 0.0, "stale_dropped": 0.0}]
    assert rollout.queue.stats["hits"] == 1 and rollout.queue.stats["misses"] == 1 and rollout.queue.stats["full"] == 1
    assert len(rollout.queue) == 1  # the [Paris] batch read ahead, never asked for
    rollout.queue.close()
    assert [(r["_ng_task_index"], r["reward"]) for r in records] == [(0, 1.0), (1, 0.0)] * 2 and not stale_once
