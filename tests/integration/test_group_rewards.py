"""Group rewards reach training: genrm_compare declares `GET /reward_scope` = group, so the trainer
client (`gymserve collect`, TRL's `rollout_func`, `gymserve train`) re-scores each finished GRPO
group through its `/verify/batch`. Real head, genrm_compare, math and simple_agent servers; the
policy and the judge are scripted `models/stub` servers (prompt rules), so rewards are exact.
"""
from __future__ import annotations

import json
from contextlib import ExitStack

import httpx
import pytest

from gymserve.testing import ServerProcess, response_with_text
from tests.integration._trainer_stack import wait_registered
from trainer.client import RolloutClient, run_sync
from trainer.collect import collect
from trainer.jsonl import read_rows
from trainer.trl import make_rollout_func

ORDER = ("BEST", "MID", "MEH", "WORST")
# the policy: for a prompt tagged [T], one answer per rule in turn (`times: 1`)
POLICY_RULES = [{"match": rf"\[{tag}\]", "times": 1, "text": text}
                for tag, texts in {"G4": ORDER, "T4": ORDER, "LAG": ORDER, "RS": ORDER, "FJ": ("F1", "F2", "F3", "F4"),
                                   "BL": ("MID", "MEH")}.items() for text in texts]
# [PF]: the policy's first answer is an error (that rollout fails), then three answers
POLICY_RULES += [{"match": r"\[PF\]", "times": 1, "status": 400, "error": "no"}]
POLICY_RULES += [{"match": r"\[PF\]", "times": 1, "text": text} for text in ("BEST", "MID", "WORST")]
POLICY_RULES += [{"match": r"\[ONE\]", "text": "MID"}]
POLICY_RULES += [{"match": r"2\+2", "text": "\\boxed{4}"}, {"match": r"3\+3", "text": "\\boxed{7}"}]
# the judge: BEST beats all, WORST loses to all, MID wins when shown first, other pairs tie; two policy
# answers of the [FJ] prompt (no reference in the question) get an unparseable verdict
JUDGE_RULES = [{"match": r"(?s)^(?!.*REF).*\[FJ\]", "text": "Hard to say."},
               {"match": r"Response A\|>\nBEST", "text": "[[A>B]]"}, {"match": r"Response B\|>\nBEST", "text": "[[B>A]]"},
               {"match": r"Response A\|>\nWORST", "text": "[[B>A]]"}, {"match": r"Response B\|>\nWORST", "text": "[[A>B]]"},
               {"match": r"Response A\|>\nMID", "text": "[[A>B]]"}, {"match": ".", "text": "[[A=B]]"}]
# points out of 2·(4-1) = 6: BEST 6; MID 2 (WORST) + 1 (first vs MEH) + 0.5 (second vs MEH); MEH 2 + 0.5; WORST 0
POINTS = {"BEST": 6.0, "MID": 3.5, "MEH": 2.5, "WORST": 0.0}
SHARES = {text: points / 6 for text, points in POINTS.items()}


@pytest.fixture(scope="module")
def stack():
    with ExitStack() as stop:
        head = stop.enter_context(ServerProcess("head", name="head"))
        env = {"GYMSERVE_HEAD_URL": head.url}

        def spec(rules: list) -> dict[str, str]:
            return {**env, "GYMSERVE_SERVER_SPEC": json.dumps({"rules": rules})}

        judge = ServerProcess("models/stub", name="judge_stub", env=spec(JUDGE_RULES))
        servers = [judge, ServerProcess("models/stub", name="policy", env=spec(POLICY_RULES)),
                   ServerProcess("resources/math", "workers=1", name="math", env=env)]
        servers += [ServerProcess("resources/genrm_compare", f"judge_model_server={judge.url}", *extra, name=name,
                                  env=env) for name, extra in (("genrm", []), ("genrm_small", ["max_batch_items=1"]))]
        servers += [ServerProcess("agents/simple_agent", f"resources_server={env_name}", "model_server=policy",
                                  name=f"{env_name}_agent", env=env) for env_name in ("genrm", "genrm_small", "math")]
        for server in servers:
            stop.callback(server.stop)
            server.launch()
        for server in servers:
            server.wait_ready()
        wait_registered(head.url, [s.name for s in servers])
        yield head


def test_servers_declare_where_and_how_they_score(stack) -> None:
    def get(name: str, path: str):
        return httpx.get(f"{stack.url}/servers/{name}{path}", timeout=10).json()

    assert get("genrm_agent", "/ready")["resources_server"] == "genrm"
    assert get("genrm", "/reward_scope") == "group" and get("math", "/reward_scope") == "item"


def _row(agent: str, prompt: str, **fields) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": prompt}]},
            "agent_ref": {"type": "responses_api_agents", "name": agent}, **fields}


def _collect(head: ServerProcess, rows: list[dict], tmp_path, repeats: int,
             resume: bool = False) -> tuple[list[dict], list[dict]]:
    async def go() -> None:
        async with RolloutClient(head.url, concurrency=8, deadline_s=60) as client:
            await collect(rows, tmp_path / "out.jsonl", client=client, repeats=repeats, resume=resume)

    run_sync(go, timeout=120)
    return read_rows(tmp_path / "out.jsonl"), read_rows(tmp_path / "out_failures.jsonl")


def _text(record: dict) -> str:
    return record["response"]["output"][-1]["content"][0]["text"]


@pytest.mark.timeout(300)
def test_collect_scores_a_group_pairwise_and_masks_failed_groups(stack, tmp_path) -> None:
    rows = [_row("genrm_agent", "Say something. [G4]", reference_response="REF"),
            _row("genrm_agent", "Say something. [FJ]", reference_response="REF"),
            _row("genrm_small_agent", "Say something. [SM]", reference_response="REF"),
            _row("genrm_agent", "Say something. [PF]", reference_response="REF")]
    done, failed = _collect(stack, rows, tmp_path, repeats=4)
    scored = {_text(r): r for r in done if r["_ng_task_index"] == 0}
    assert set(scored) == set(ORDER), failed
    for text, share in SHARES.items():
        record = scored[text]
        assert record["reward"] == share and record["mask_sample"] is False
        # the group's verdict, not the single /verify against the reference (2 questions)
        assert record["genrm_questions"] == 6 and len(record["judge_evaluations"]) == 6
        assert record["genrm_points"] == POINTS[text] and record["group_id"] == "genrm_agent:0"
        assert record["_ng_task_index"] == 0 and record["num_turns"] == 1
    by_task = {task: [r for r in failed if r["_ng_task_index"] == task] for task in (1, 2, 3)}
    # each [FJ] answer scored 0.5 against the reference, but the judge cannot decide a pair of them:
    # every item of the group reply is masked, so every sample is
    assert len(by_task[1]) == 4
    for record in by_task[1]:
        assert record["failure_kind"] == "upstream" and "verdict" in record["failure_reason"]
        assert record["reward"] is None and record["mask_sample"] is True
    # genrm_small takes at most 1 batch item: the group's /verify/batch fails, so the whole group is masked
    assert len(by_task[2]) == 4
    for record in by_task[2]:
        assert record["failure_kind"] == "upstream" and record["reward"] is None
        assert "genrm_small" in record["failure_reason"] and "max_batch_items" in record["failure_reason"]
        assert "genrm_points" not in record and "judge_evaluations" not in record  # the single verdict is gone
    # a rollout that failed stays failed and is left out: the other three are compared (4 questions each)
    assert len(by_task[3]) == 1 and by_task[3][0]["failure_kind"] == "bad_request"
    rest = {_text(r): (r["reward"], r["genrm_questions"]) for r in done if r["_ng_task_index"] == 3}
    assert rest == {"BEST": (1.0, 4), "MID": (0.5, 4), "WORST": (0.0, 4)}


@pytest.mark.timeout(300)
def test_blend_leaves_math_rewards_alone(stack, tmp_path) -> None:
    rows = [_row("math_agent", "What is 2+2?", expected_answer="4"),
            _row("genrm_agent", "Say something. [BL]", reference_response="REF"),
            _row("math_agent", "What is 3+3?", expected_answer="6")]
    done, failed = _collect(stack, rows, tmp_path, repeats=2)
    assert not failed and len(done) == 6
    math = sorted((r["_ng_task_index"], r["reward"]) for r in done if r["agent_ref"]["name"] == "math_agent")
    assert math == [(0, 1.0), (0, 1.0), (2, 0.0), (2, 0.0)]
    assert not any("group_id" in r for r in done if r["agent_ref"]["name"] == "math_agent")
    genrm = {_text(r): r["reward"] for r in done if r["agent_ref"]["name"] == "genrm_agent"}
    assert genrm == {"MID": 0.75, "MEH": 0.25}  # against each other (against the reference: 0.75 and 0.5)
    # a group of one keeps the agent's verdict: against the reference, 2 questions
    (alone,), _ = _collect(stack, [_row("genrm_agent", "Say something. [ONE]", reference_response="REF")],
                           tmp_path, repeats=1)
    assert (alone["reward"], alone["genrm_questions"]) == (0.75, 2) and "group_id" not in alone


@pytest.mark.timeout(300)
def test_resume_runs_a_partly_finished_group_again_whole(stack, tmp_path) -> None:
    """A run stopped with 2 of a genrm group's 4 rollouts written (and 1 of a math row's 2): on
    resume the genrm group runs again whole, the math rollout already written is kept."""
    rows = [_row("genrm_agent", "Say something. [RS]", reference_response="REF"),
            _row("math_agent", "What is 2+2?", expected_answer="4")]
    earlier = [{**row, "_ng_task_index": task, "_ng_rollout_index": 0, "reward": 0.5, "mask_sample": False,
                "response": response_with_text("OLD"), "earlier": True} for task, row in enumerate(rows)]
    earlier.insert(1, {**earlier[0], "_ng_rollout_index": 1})
    (tmp_path / "out.jsonl").write_text("".join(json.dumps(r) + "\n" for r in earlier))
    done, failed = _collect(stack, rows, tmp_path, repeats=4, resume=True)
    assert not failed
    genrm = [r for r in done if r["_ng_task_index"] == 0]
    assert {_text(r): r["reward"] for r in genrm} == SHARES and not any(r.get("earlier") for r in genrm)
    math = sorted((r["_ng_rollout_index"], bool(r.get("earlier"))) for r in done if r["_ng_task_index"] == 1)
    assert math == [(0, True), (1, False), (2, False), (3, False)]


@pytest.mark.timeout(300)
def test_trl_rollout_func_scores_the_group(stack) -> None:
    """TRL hands the rollout function each prompt `num_generations` times: one group."""
    row = _row("genrm_agent", "Say something. [T4]", reference_response="REF")
    seen: list[dict] = []
    rollout = make_rollout_func(stack.url, None, rows=[row], on_records=seen.extend)
    try:
        rollout([[{"role": "user", "content": "Say something. [T4]"}]] * 4, None)
    finally:
        run_sync(lambda: rollout.client.aclose())
    assert {_text(r): r["reward"] for r in seen} == SHARES
    assert all(r["genrm_questions"] == 6 for r in seen)


@pytest.mark.timeout(300)
def test_trl_stale_sample_rolled_out_again_is_scored_with_its_group(stack) -> None:
    """Asynchronous rollouts: a prefetched sample judged stale is rolled out again (the policy, its
    script spent, now says "42"); its group is scored again with it, not the new sample alone."""
    prompt = [{"role": "user", "content": "Say something. [LAG]"}]
    seen: list[dict] = []
    rollout = make_rollout_func(stack.url, None, rows=[_row("genrm_agent", prompt[0]["content"],
                                                            reference_response="REF")],
                                on_records=seen.extend, max_policy_lag=1,
                                is_stale=lambda _trainer, record: _text(record) == "MEH")
    try:
        assert rollout.prefetch([{"prompt": prompt}] * 4, None)
        rollout([prompt] * 4, None)
    finally:
        rollout.queue.close()
        run_sync(lambda: rollout.client.aclose())
    # "42" takes MEH's place (against the reference alone it would get 0.5)
    assert {_text(r): r["reward"] for r in seen} == {**{t: SHARES[t] for t in ("BEST", "MID", "WORST")},
                                                     "42": SHARES["MEH"]}
