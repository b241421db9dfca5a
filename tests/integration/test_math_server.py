"""math and math_multi_reward as real servers (`gymserve serve` subprocesses, real math-verify
in real worker processes)."""
from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from gymserve.testing import ServerProcess, verify_body

PATHOLOGICAL = "The answer is \\boxed{9^{9^{9^{9}}}}"
DEADLINE_S = 6.0


@pytest.fixture(scope="module")
def math_server() -> Iterator[ServerProcess]:
    # math-verify's own timeout above the pool deadline: the pool's hard deadline is what stops it
    with ServerProcess("resources/math", "workers=2", f"verify_deadline_s={DEADLINE_S}",
                       "math_verify_timeout_s=60") as server:
        yield server


@pytest.fixture(scope="module")
def masking_server() -> Iterator[ServerProcess]:
    with ServerProcess("resources/math", "workers=2", "verify_deadline_s=3", "math_verify_timeout_s=60",
                       "timeout_policy=mask", name="math_masking") as server:
        yield server


def strip(reply: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in reply.items() if k not in ("response", "responses_create_params")}


def verify(server: ServerProcess, text: str, **fields: Any) -> dict[str, Any]:
    r = server.post("/verify", verify_body(text, **fields))
    assert r.status_code == 200, r.text
    return r.json()


# ---- scoring ---------------------------------------------------------------- #
@pytest.mark.parametrize("text,expected,reward", [
    ("Adding them gives \\boxed{42}.", "42", 1.0),
    ("Adding them gives \\boxed{41}.", "42", 0.0),
    ("So the probability is 0.5", "\\frac{1}{2}", 1.0),
    ("So the probability is $\\frac{1}{2}$", "0.5", 1.0),
    ("Expanding gives $x^2+2x+1$", "(x+1)^2", 1.0),
    ("The answer is 1024", 1024, 1.0),  # a numeric expected_answer is accepted
])
def test_rewards(math_server: ServerProcess, text: str, expected: Any, reward: float) -> None:
    reply = verify(math_server, text, expected_answer=expected, question="q1")
    assert reply["reward"] == reward
    assert reply["mask_sample"] is False and "failure_kind" not in reply
    assert reply["question"] == "q1" and reply["expected_answer"] == expected  # row fields echoed


def test_ground_truth_is_accepted_as_the_answer_field(math_server: ServerProcess) -> None:
    assert verify(math_server, "\\boxed{12}", ground_truth="12")["reward"] == 1.0


def test_extracted_answer(math_server: ServerProcess) -> None:
    assert verify(math_server, "so \\boxed{17}", expected_answer="17")["extracted_answer"] == "17"
    assert verify(math_server, "so \\boxed{18}", expected_answer="17")["extracted_answer"] == "18"
    reply = verify(math_server, "I give up.", expected_answer="17")
    assert reply["reward"] == 0.0 and reply["extracted_answer"] is None


def test_no_output_text_is_a_reasoned_zero(math_server: ServerProcess) -> None:
    body = verify_body("x", expected_answer="3")
    body["response"]["output"] = []
    r = math_server.post("/verify", body)
    assert r.status_code == 200 and r.json()["reward"] == 0.0 and r.json()["mask_sample"] is False


def test_one_megabyte_response(math_server: ServerProcess) -> None:
    text = "Let me think about this step by step. " * 27_000 + "So the answer is \\boxed{7}."
    assert len(text) > 1_000_000
    r = math_server.post("/verify", verify_body(text, expected_answer="7"))
    assert r.status_code == 200, r.text[:300]
    assert r.json()["reward"] == 1.0 and r.json()["mask_sample"] is False  # the boxed answer at the end is found
    wrong = math_server.post("/verify", verify_body(text, expected_answer="8")).json()
    assert wrong["reward"] == 0.0 and wrong["mask_sample"] is False


# ---- bad input -------------------------------------------------------------- #
@pytest.mark.parametrize("fields,needle", [
    ({}, "expected_answer: missing"),
    ({"expected_answer": "}{"}, "not parsable"),
    ({"expected_answer": "\\frac{1}{"}, "not parsable"),
    ({"expected_answer": "$$"}, "not parsable"),
    ({"expected_answer": ["3"]}, "must be a string or a number"),
    ({"expected_answer": "  "}, "empty"),
])
def test_bad_expected_answer_is_a_4xx_naming_it(math_server: ServerProcess, fields: dict[str, Any],
                                                needle: str) -> None:
    r = math_server.post("/verify", verify_body("42", **fields))
    assert 400 <= r.status_code < 500
    assert needle in r.json()["detail"] and "expected_answer" in r.json()["detail"]


def test_answer_format_number_over_http_single_and_batch(math_server: ServerProcess) -> None:
    """`answer_format: number`: a restated sum is not an answer, in /verify and /verify/batch alike;
    an unknown format is a 400 naming the field (a failed item in a batch)."""
    for text, reward in (("To add 3 + 4,", 0.0), ("3 + 4 = 7", 1.0)):
        r = math_server.post("/verify", verify_body(text, expected_answer="7", answer_format="number"))
        assert r.status_code == 200 and r.json()["reward"] == reward, r.text
    assert math_server.post("/verify", verify_body("To add 3 + 4,", expected_answer="7")).json()["reward"] == 1.0
    bad = math_server.post("/verify", verify_body("7", expected_answer="7", answer_format="digits"))
    assert bad.status_code == 400 and "answer_format" in bad.json()["detail"]
    replies = math_server.post("/verify/batch", [
        verify_body("To add 3 + 4,", expected_answer="7", answer_format="number"),
        verify_body("3 + 4 = 7", expected_answer="7", answer_format="number"),
        verify_body("7", expected_answer="7", answer_format=["number"])]).json()
    assert [x["reward"] for x in replies] == [0.0, 1.0, 0.0]
    assert replies[2]["failure_kind"] == "bad_request" and "answer_format" in replies[2]["failure_reason"]


@pytest.mark.parametrize("body", [
    {"responses_create_params": {"input": []}, "expected_answer": "3"},  # no response
    {"responses_create_params": {"input": []}, "response": "42", "expected_answer": "3"},  # wrong type
    {"responses_create_params": {"input": []}, "response": {"output": "text"}, "expected_answer": "3"},
    ["not", "an", "object"],
])
def test_malformed_bodies_are_4xx(math_server: ServerProcess, body: Any) -> None:
    r = math_server.post("/verify", body)
    assert 400 <= r.status_code < 500, r.text
    assert "response" in r.json()["detail"] or "body" in r.json()["detail"]


def test_malformed_json_is_400(math_server: ServerProcess) -> None:
    r = math_server.post("/verify", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["detail"]


# ---- batch and metrics ------------------------------------------------------ #
def test_batch_keeps_order_and_fails_items_alone(math_server: ServerProcess) -> None:
    items = [
        verify_body("\\boxed{1}", expected_answer="1", i=0),
        verify_body("\\boxed{2}", i=1),  # no expected_answer
        verify_body("\\boxed{2}", expected_answer="3", i=2),
        verify_body("\\boxed{2}", expected_answer="}{", i=3),  # unparsable
        "not an object",
        verify_body("It is 0.5", expected_answer="\\frac{1}{2}", i=5),
    ]
    r = math_server.post("/verify/batch", items)
    assert r.status_code == 200
    replies = r.json()
    assert len(replies) == len(items)
    assert [x.get("i") for x in replies] == [0, 1, 2, 3, None, 5]
    assert [x["reward"] for x in replies] == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert [x.get("failure_kind") for x in replies] == [None, "bad_request", None, "bad_request", "bad_request", None]
    assert [x["mask_sample"] for x in replies] == [False, True, False, True, True, False]
    assert "expected_answer" in replies[1]["failure_reason"] and "parsable" in replies[3]["failure_reason"]
    # the wrapped form is accepted too
    wrapped = math_server.post("/verify/batch", {"requests": items[:1]})
    assert wrapped.status_code == 200 and wrapped.json()[0]["reward"] == 1.0


def test_aggregate_metrics(math_server: ServerProcess) -> None:
    # two tasks x three rollouts; task 0 solved twice, task 1 never; one masked sample
    texts = {(0, 0): "\\boxed{5}", (0, 1): "\\boxed{4}", (0, 2): "\\boxed{5}",
             (1, 0): "\\boxed{1}", (1, 1): "\\boxed{2}", (1, 2): "\\boxed{3}"}
    items = [verify_body(text, expected_answer="5" if task == 0 else "9", _ng_task_index=task,
                         _ng_rollout_index=rollout) for (task, rollout), text in texts.items()]
    items.append(verify_body("\\boxed{5}", _ng_task_index=1, _ng_rollout_index=3))  # bad row -> masked
    replies = math_server.post("/verify/batch", items).json()
    metrics = math_server.post("/aggregate_metrics", replies).json()
    assert metrics["num_samples"] == 7 and metrics["num_scored"] == 6 and metrics["num_masked"] == 1
    assert metrics["reward"]["mean"] == pytest.approx(2 / 6)
    assert metrics["reward"]["min"] == 0.0 and metrics["reward"]["max"] == 1.0
    assert metrics["reward"]["std"] == pytest.approx((2 / 6 * (1 - 2 / 6)) ** 0.5)
    assert metrics["failures"] == {"bad_request": 1}
    assert metrics["pass@1"] == pytest.approx((2 / 3 + 0) / 2)
    assert metrics["pass@3"] == pytest.approx((1 + 0) / 2)


# ---- deadlines and crashes -------------------------------------------------- #
@pytest.mark.timeout(120)
def test_pathological_expression_costs_one_worker_not_the_others(math_server: ServerProcess) -> None:
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        slow = pool.submit(verify, math_server, PATHOLOGICAL, expected_answer="7")
        time.sleep(0.3)  # let it reach a worker on its own
        others = [pool.submit(verify, math_server, f"so the answer is \\boxed{{{n}}}", expected_answer=str(n))
                  for n in range(12)]
        fast = [f.result() for f in others]
        # the other worker answered all twelve while the pathological one still held its worker
        assert not slow.done()
        slow_reply = slow.result()
    assert all(reply["reward"] == 1.0 for reply in fast)
    assert slow_reply["reward"] == 0.0 and slow_reply["failure_kind"] == "timeout"
    assert slow_reply["mask_sample"] is False  # timeout_policy=zero (NeMo RL's behaviour)
    assert f"the {DEADLINE_S:g}s deadline" in slow_reply["failure_reason"], slow_reply["failure_reason"]
    # the replaced worker serves again
    assert verify(math_server, "\\boxed{3}", expected_answer="3")["reward"] == 1.0


def test_timeout_policy_mask(masking_server: ServerProcess) -> None:
    body = verify_body(PATHOLOGICAL, expected_answer="7")
    reply = masking_server.post("/verify", body, timeout=60).json()
    assert reply["failure_kind"] == "timeout" and reply["mask_sample"] is True and reply["reward"] == 0.0


def test_batch_with_a_pathological_item_fails_only_that_item(masking_server: ServerProcess) -> None:
    """The chunk holding the slow item hits its deadline and is re-run item by item."""
    items = [verify_body(f"\\boxed{{{n}}}", expected_answer=str(n)) for n in range(6)]
    items.insert(3, verify_body(PATHOLOGICAL, expected_answer="7"))
    replies = masking_server.post("/verify/batch", items, timeout=120).json()
    assert [x["reward"] for x in replies] == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert [x.get("failure_kind") for x in replies] == [None, None, None, "timeout", None, None, None]
    assert replies[3]["mask_sample"] is True and replies[4]["mask_sample"] is False


def test_batch_one_pool_item_per_request() -> None:
    """batch_chunk=1: every item is its own pool item with its own deadline."""
    with ServerProcess("resources/math", "workers=2", "batch_chunk=1", "verify_deadline_s=2",
                       "math_verify_timeout_s=60", name="math_each") as server:
        items = [verify_body(f"\\boxed{{{n}}}", expected_answer=str(n)) for n in range(5)]
        items.insert(1, verify_body(PATHOLOGICAL, expected_answer="7"))
        items.insert(3, verify_body("\\boxed{1}"))
        replies = server.post("/verify/batch", items, timeout=60).json()
    assert [x["reward"] for x in replies] == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert [x.get("failure_kind") for x in replies] == [None, "timeout", None, "bad_request", None, None, None]
    assert [x["mask_sample"] for x in replies] == [False, False, False, True, False, False, False]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                pass
    return found


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _wait_workers_idle(pid: int, count: int) -> None:
    """Until `count` workers exist and none uses CPU (a replacement may still be importing sympy)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = _children(pid)
        if len(workers) == count:
            before = {w: _cpu_ticks(w) for w in workers}
            time.sleep(0.3)
            if all(_cpu_ticks(w) == before[w] for w in workers):
                return
        else:
            time.sleep(0.2)
    raise AssertionError("workers did not become idle")


def test_worker_crash_masks_the_sample(masking_server: ServerProcess) -> None:
    """Kill the worker that is busy on a slow check: the reply is masked as a crash."""
    assert masking_server.proc is not None
    _wait_workers_idle(masking_server.proc.pid, 2)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(masking_server.post, "/verify", verify_body(PATHOLOGICAL, expected_answer="7"))
        time.sleep(0.5)
        workers = _children(masking_server.proc.pid)
        before = {pid: _cpu_ticks(pid) for pid in workers}
        time.sleep(0.5)
        busy = max(workers, key=lambda pid: _cpu_ticks(pid) - before[pid])
        os.kill(busy, signal.SIGKILL)
        reply = pending.result().json()
    assert reply["mask_sample"] is True and reply["failure_kind"] == "crash"
    assert "died" in reply["failure_reason"]
    assert verify(masking_server, "\\boxed{3}", expected_answer="3")["reward"] == 1.0


# ---- math_multi_reward ------------------------------------------------------ #
GOOD = "<think>\n48 / 2 = 24, 48 + 24 = 72\n</think>\n<answer>\n72\n</answer>"


@pytest.fixture(scope="module")
def multi_server() -> Iterator[ServerProcess]:
    with ServerProcess("resources/math_multi_reward") as server:
        yield server


def test_multi_reward_components(multi_server: ServerProcess) -> None:
    reply = verify(multi_server, GOOD, expected_answer="72")
    assert reply["reward_components"] == {"correctness": 1.0, "integer": 1.0, "format": 1.0}
    assert reply["reward"] == 3.0 and reply["extracted_answer"] == "72"
    reply = verify(multi_server, "<think>hmm</think><answer>72.0</answer>", expected_answer="72")
    assert reply["reward_components"] == {"correctness": 0.0, "integer": 0.0, "format": 0.0}
    reply = verify(multi_server, "<think>x</think>\n<answer>71</answer>", expected_answer="72")
    assert reply["reward_components"] == {"correctness": 0.0, "integer": 1.0, "format": 1.0}
    assert reply["reward"] == 2.0


def test_multi_reward_row_with_reply_fields_is_rescored(multi_server: ServerProcess) -> None:
    """A row that already carries reply fields (a re-verified rollout) gets fresh ones."""
    reply = verify(multi_server, GOOD, expected_answer="72", reward=0.0, extracted_answer="x",
                   reward_components={"old": 5.0}, mask_sample=True, failure_kind="crash")
    assert reply["reward"] == 3.0 and reply["extracted_answer"] == "72" and reply["mask_sample"] is False
    assert set(reply["reward_components"]) == {"correctness", "integer", "format"} and "failure_kind" not in reply


def test_math_row_with_reply_fields_is_rescored(math_server: ServerProcess) -> None:
    reply = verify(math_server, "\\boxed{2}", expected_answer="2", reward=0.0, extracted_answer="x",
                   mask_sample=True, failure_kind="crash", failure_reason="old")
    assert reply["reward"] == 1.0 and reply["extracted_answer"] == "2" and reply["mask_sample"] is False
    assert "failure_kind" not in reply and "failure_reason" not in reply


def test_multi_reward_bad_input(multi_server: ServerProcess) -> None:
    r = multi_server.post("/verify", verify_body(GOOD))
    assert r.status_code == 400 and "expected_answer" in r.json()["detail"]
    r = multi_server.post("/verify", verify_body(GOOD, expected_answer={"a": 1}))
    assert r.status_code == 400 and "expected_answer" in r.json()["detail"]
    r = multi_server.post("/verify", verify_body("<answer>1</answer>" * 60_000, expected_answer="1"))
    assert r.status_code == 200 and r.json()["reward_components"]["format"] == 0.0


def test_multi_reward_batch_and_component_metrics(multi_server: ServerProcess) -> None:
    items = [verify_body(GOOD, expected_answer="72", _ng_task_index=0, _ng_rollout_index=0),
             verify_body("<answer>5</answer>", expected_answer="72", _ng_task_index=0, _ng_rollout_index=1),
             verify_body(GOOD, _ng_task_index=0, _ng_rollout_index=2)]
    replies = multi_server.post("/verify/batch", items).json()
    assert [x["reward"] for x in replies] == [3.0, 1.0, 0.0]
    assert replies[2]["failure_kind"] == "bad_request" and replies[2]["mask_sample"] is True
    metrics = multi_server.post("/aggregate_metrics", {"verify_responses": replies}).json()
    assert metrics["reward"]["mean"] == 2.0 and metrics["reward"]["max"] == 3.0
    components = metrics["reward_components"]
    assert components["correctness"]["mean"] == 0.5 and components["integer"]["mean"] == 1.0
    assert components["format"]["min"] == 0.0 and components["format"]["max"] == 1.0
    assert metrics["failures"] == {"bad_request": 1}


def test_multi_reward_math_verify_correctness() -> None:
    with ServerProcess("resources/math_multi_reward", "correctness=math_verify", "workers=1",
                       name="math_multi_reward_mv") as server:
        reply = verify(server, "<think>x</think>\n<answer>0.5</answer>", expected_answer="\\frac{1}{2}")
        assert reply["reward_components"] == {"correctness": 1.0, "integer": 0.0, "format": 1.0}
        reply = verify(server, "<think>x</think>\n<answer>3</answer>", expected_answer="4")
        assert reply["reward_components"]["correctness"] == 0.0
        r = server.post("/verify", verify_body(GOOD, expected_answer="}{"))
        assert r.status_code == 400 and "expected_answer" in r.json()["detail"]


# ---- example data ----------------------------------------------------------- #
ROOT = Path(__file__).resolve().parents[2]


def _rows(name: str) -> list[dict[str, Any]]:
    import json

    lines = (ROOT / "datasets" / name / "example.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_math_example_rows_score_their_own_answers(math_server: ServerProcess) -> None:
    rows = _rows("math")
    assert len(rows) >= 5
    for row in rows:
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "math_simple_agent"}
        body = {**row, "response": verify_body(f"So the answer is $\\boxed{{{row['expected_answer']}}}$.")["response"]}
        r = math_server.post("/verify", body)
        assert r.status_code == 200 and r.json()["reward"] == 1.0, (row["expected_answer"], r.text)


def test_multi_reward_example_rows(multi_server: ServerProcess) -> None:
    rows = _rows("math_multi_reward")
    assert len(rows) >= 5
    for row in rows:
        assert row["agent_ref"]["name"] == "math_multi_reward_simple_agent"
        assert row["expected_answer"].isdigit()
        assert "<think>" in str(row["responses_create_params"]) and "<answer>" in str(row["responses_create_params"])
        text = f"<think>\nworking\n</think>\n<answer>\n{row['expected_answer']}\n</answer>"
        body = {**row, "response": verify_body(text)["response"]}
        reply = multi_server.post("/verify", body).json()
        assert reply["reward"] == 3.0, reply
