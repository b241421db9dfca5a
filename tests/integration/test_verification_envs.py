"""code_jaccard, mcqa, instruction_following, reasoning_gym as real servers (`gymserve serve` subprocesses).

Each server is started once per module; every test sends real HTTP requests.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from gymserve.testing import ServerProcess, response_with_text, verify_body

ROOT = Path(__file__).resolve().parents[2]
ONE_MB = "word " * (1024 * 1024 // 5 + 1)


def examples(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (ROOT / "datasets" / name / "example.jsonl").read_text().splitlines()]


def body_for(row: dict[str, Any], text: str, **extra: Any) -> dict[str, Any]:
    row = {k: v for k, v in row.items() if k != "agent_ref"}
    return {**row, "response": response_with_text(text), **extra}


def no_text_body(**fields: Any) -> dict[str, Any]:
    return {"responses_create_params": {"input": "q"}, "response": {"output": []}, **fields}


@pytest.fixture(scope="module")
def jaccard() -> Iterator[ServerProcess]:
    with ServerProcess("resources/code_jaccard") as server:
        yield server


@pytest.fixture(scope="module")
def mcqa() -> Iterator[ServerProcess]:
    with ServerProcess("resources/mcqa", "workers=1", "verify_deadline_s=2") as server:
        yield server


@pytest.fixture(scope="module")
def ifeval() -> Iterator[ServerProcess]:
    with ServerProcess("resources/instruction_following", "workers=1", "reward_mode=fraction") as server:
        yield server


@pytest.fixture(scope="module")
def rgym() -> Iterator[ServerProcess]:
    with ServerProcess("resources/reasoning_gym", "workers=1") as server:
        yield server


def assert_bad_request(response, *words: str) -> None:
    assert response.status_code == 400, response.text
    message = response.json()["detail"]
    for word in words:
        assert word in message, message


# --------------------------------------------------------------------------- #
# code_jaccard
# --------------------------------------------------------------------------- #
def test_jaccard_example_rows(jaccard):
    for row in examples("code_jaccard"):
        truth = row.get("expected_answer", row.get("ground_truth"))
        reply = jaccard.post("/verify", json=body_for(row, truth.upper() + "\n")).json()
        assert reply["reward"] == 1.0 and reply["aligned"] is True
        assert reply["responses_create_params"] == row["responses_create_params"]
        reply = jaccard.post("/verify", json=body_for(row, "completely unrelated words")).json()
        assert reply["reward"] < 0.5 and reply["aligned"] is False


def test_jaccard_batch_order_and_aggregate(jaccard):
    items = [verify_body("a b", expected_answer="a b c"), {"response": "not an object"},
             verify_body("a", expected_answer=["x"]), verify_body("x y", ground_truth="x y")]
    replies = jaccard.post("/verify/batch", json=items).json()
    assert [r["reward"] for r in replies] == pytest.approx([2 / 3 * 3 / 5, 0.0, 0.0, 1.0])
    assert [r.get("failure_kind") for r in replies] == [None, "bad_request", "bad_request", None]
    assert "expected_answer" in replies[2]["failure_reason"]
    metrics = jaccard.post("/aggregate_metrics", json=replies).json()
    assert metrics["num_scored"] == 2 and metrics["failures"] == {"bad_request": 2}
    assert metrics["reward"]["max"] == 1.0


def test_jaccard_bad_input(jaccard):
    assert_bad_request(jaccard.post("/verify", json=verify_body("x")), "expected_answer")
    assert_bad_request(jaccard.post("/verify", json=verify_body("x", expected_answer=7)), "expected_answer", "string")
    assert_bad_request(jaccard.post("/verify", json={"expected_answer": "x"}), "response")
    reply = jaccard.post("/verify", json=no_text_body(expected_answer="x")).json()
    assert reply["reward"] == 0.0 and reply["aligned"] is False
    reply = jaccard.post("/verify", json=verify_body(ONE_MB, expected_answer="word")).json()
    assert reply["reward"] == 0.0 and "max_response_chars" in reply["reward_reason"]


# --------------------------------------------------------------------------- #
# mcqa
# --------------------------------------------------------------------------- #
def test_mcqa_example_rows(mcqa):
    for row in examples("mcqa"):
        right = row["expected_answer"]
        wrong = next(k for opt in row["options"] for k in opt if k != right)
        text = f"Reasoning...\n\\boxed{{{right}}}" if row.get("grading_mode") else f"Hmm.\nAnswer: {right}"
        reply = mcqa.post("/verify", json=body_for(row, text)).json()
        assert (reply["reward"], reply["extracted_answer"]) == (1.0, right)
        reply = mcqa.post("/verify", json=body_for(row, f"Answer: {wrong}" if not row.get("grading_mode")
                                                    else f"\\boxed{{{wrong}}}")).json()
        assert (reply["reward"], reply["extracted_answer"]) == (0.0, wrong)


def test_mcqa_option_shapes_and_metadata(mcqa):
    as_dict = verify_body("Answer: B", options={"A": "x", "B": "y"}, expected_answer="b")
    in_metadata = verify_body("\\boxed{A}", metadata={"options": [{"A": "x"}, {"B": "y"}], "expected_answer": "A"})
    texts = verify_body("so C", options=["x", "y", "z"], expected_answer="C")
    replies = mcqa.post("/verify/batch", json=[as_dict, in_metadata, texts]).json()
    assert [r["reward"] for r in replies] == [1.0, 1.0, 1.0]


def test_mcqa_hostile_row_regex_times_out_alone(mcqa):
    """A row regex with catastrophic backtracking costs one worker its deadline; others still answer."""
    hostile = verify_body("a" * 40 + "!", options={"A": "x", "B": "y"}, expected_answer="A",
                          template_metadata={"output_regex": r"(a+)+$"})
    normal = [verify_body("Answer: A", options={"A": "x", "B": "y"}, expected_answer="A") for _ in range(20)]
    replies = mcqa.post("/verify/batch", json=[hostile, *normal], timeout=60).json()
    assert replies[0]["mask_sample"] is True and replies[0]["failure_kind"] == "timeout"
    assert all(r["reward"] == 1.0 for r in replies[1:])
    # the worker was replaced: the pool still answers
    assert mcqa.post("/verify", json=hostile | {"template_metadata": {"output_regex": "<(A)>"},
                                                "response": response_with_text("<A>")}).json()["reward"] == 1.0


def test_mcqa_bad_input(mcqa):
    assert_bad_request(mcqa.post("/verify", json=verify_body("Answer: A", expected_answer="A")), "options")
    assert_bad_request(mcqa.post("/verify", json=verify_body("A", options={"A": "x"}, expected_answer="Q")),
                       "expected_answer", "'Q'")
    assert_bad_request(mcqa.post("/verify", json=verify_body("A", options=42, expected_answer="A")), "options")
    assert_bad_request(mcqa.post("/verify", json=verify_body("A", options={"A": "x"}, expected_answer="A",
                                                               grading_mode="psychic")), "grading_mode")
    assert_bad_request(mcqa.post("/verify", json=verify_body("A", options={"A": "x"}, expected_answer="A",
                                                               template_metadata={"output_regex": "("})),
                       "output_regex")
    reply = mcqa.post("/verify", json=no_text_body(options={"A": "x"}, expected_answer="A")).json()
    assert reply["reward"] == 0.0 and reply.get("extracted_answer") is None
    reply = mcqa.post("/verify", json=verify_body(ONE_MB + "\nAnswer: B", options={"A": "x", "B": "y"},
                                                  expected_answer="B")).json()
    assert reply["reward"] == 1.0


# --------------------------------------------------------------------------- #
# instruction_following
# --------------------------------------------------------------------------- #
def test_ifeval_per_instruction_results_and_fraction(ifeval):
    body = verify_body("<<Sea>>\nwaves roll in, and out",
                       instruction_id_list=["detectable_format:title", "punctuation:no_comma",
                                            "change_case:english_lowercase"],
                       kwargs=[{}, {}, {}])
    reply = ifeval.post("/verify", json=body).json()
    assert reply["instruction_results"] == [
        {"id": "detectable_format:title", "passed": True},
        {"id": "punctuation:no_comma", "passed": False},
        {"id": "change_case:english_lowercase", "passed": False},  # "<<Sea>>" has a capital
    ]
    assert reply["reward"] == pytest.approx(1 / 3) and reply["follow_all_instructions"] is False


def test_ifeval_example_rows_verify(ifeval):
    rows = examples("instruction_following")
    replies = ifeval.post("/verify/batch", json=[body_for(r, "A plain reply, with a comma.") for r in rows]).json()
    assert len(replies) == len(rows)
    for row, reply in zip(rows, replies):
        assert [r["id"] for r in reply["instruction_results"]] == row["instruction_id_list"]
        assert reply.get("failure_kind") is None and 0.0 <= reply["reward"] <= 1.0
    assert replies[0]["instruction_results"][1] == {"id": "punctuation:no_comma", "passed": False}


def test_ifeval_long_response_runs_in_pool(ifeval):
    body = verify_body(ONE_MB, instruction_id_list=["length_constraints:number_words", "punctuation:no_comma"],
                       kwargs=[{"num_words": 1000, "relation": "at least"}, {}])
    reply = ifeval.post("/verify", json=body).json()
    assert reply["reward"] == 1.0 and reply.get("mask_sample") is False


def test_ifeval_bad_input(ifeval):
    assert_bad_request(ifeval.post("/verify", json=verify_body("x", instruction_id_list=["made:up"], kwargs=[{}])),
                       "made:up")
    assert_bad_request(ifeval.post("/verify", json=verify_body("x")), "instruction_id_list")
    assert_bad_request(ifeval.post("/verify", json=verify_body(
        "x", instruction_id_list=["length_constraints:number_words"], kwargs=[{"relation": "at least"}])),
        "num_words")
    assert_bad_request(ifeval.post("/verify", json=verify_body(
        "x", instruction_id_list=["punctuation:no_comma"], kwargs="nope")), "kwargs")
    reply = ifeval.post("/verify", json=no_text_body(instruction_id_list=["punctuation:no_comma"], kwargs=[{}])).json()
    assert reply["reward"] == 0.0 and reply["instruction_results"][0]["passed"] is False


def test_ifeval_nemo_gym_verifier_metadata_rows(ifeval):
    """NeMo-Gym's row format: fields under verifier_metadata (winning over top-level ones),
    grading_mode per row (the server runs reward_mode=fraction), the last output item judged."""
    meta = {"instruction_id_list": ["punctuation:no_comma", "change_case:english_lowercase"], "kwargs": [{}, None],
            "prompt": "p"}
    text = "no commas, Here"  # breaks both
    row = {"id": 7, "responses_create_params": {"input": "q"}}
    binary = ifeval.post("/verify", json={**verify_body("all lower no commas"), **row,
                                          "verifier_metadata": {**meta, "grading_mode": "binary"}}).json()
    assert binary["reward"] == 1.0 and binary["follow_instruction_list"] == [True, True]
    half = ifeval.post("/verify", json={**verify_body("Upper no commas"), **row, "verifier_metadata": meta}).json()
    assert half["reward"] == 0.5  # no grading_mode: the server's reward_mode
    strict = ifeval.post("/verify", json={**verify_body("Upper no commas"), **row, "grading_mode": "fraction",
                                          "verifier_metadata": {**meta, "grading_mode": "binary"}}).json()
    assert strict["reward"] == 0.0  # verifier_metadata wins over the top level
    legacy = ifeval.post("/verify", json={**verify_body("Upper no commas"), **row, "grading_mode": "binary",
                                          "instruction_id_list": meta["instruction_id_list"], "kwargs": [{}, {}]})
    assert legacy.json()["reward"] == 0.0
    two_items = verify_body(text)
    two_items["response"]["output"].append({"type": "message", "role": "assistant",
                                            "content": [{"type": "output_text", "text": "fine now"}]})
    last = ifeval.post("/verify", json={**two_items, **row, "verifier_metadata": meta}).json()
    assert last["reward"] == 1.0  # only the last output item, as NeMo-Gym reads it
    assert_bad_request(ifeval.post("/verify", json={**verify_body("x"), **row, "verifier_metadata": {
        **meta, "grading_mode": "partial"}}), "verifier_metadata.grading_mode")
    assert_bad_request(ifeval.post("/verify", json={**verify_body("x"), **row, "verifier_metadata": {
        **meta, "instruction_id_list": ["made:up"], "kwargs": [{}]}}), "made:up")
    assert ifeval.post("/verify", json={**verify_body("x"), "verifier_metadata": "nope"}).status_code in (400, 422)


def test_ifeval_open_instruct_and_ifbench_ids(ifeval):
    """open-instruct and IFBench ids in a NeMo-Gym row: the NLTK-tokenizing ones run in the worker
    pool; bad kwargs and the one unsupported id are 400s naming them."""
    meta = {"instruction_id_list": ["keywords:start_end", "count:pronouns", "copy:repeat_phrase", "format:emoji"],
            "kwargs": [None, {"N": 2}, {"phrase": "Time flies when having fun", "small_n": 1}, {}], "prompt": "p"}
    text = "Time goes when having fun, I think, and you agree: time"
    reply = ifeval.post("/verify", json={**verify_body(text), "verifier_metadata": meta}).json()
    assert reply["follow_instruction_list"] == [True, True, True, False] and reply["reward"] == 0.75
    bad = {**meta, "kwargs": [None, {"N": "many"}, meta["kwargs"][2], {}]}
    assert_bad_request(ifeval.post("/verify", json={**verify_body(text), "verifier_metadata": bad}),
                       "count:pronouns", "'N'")
    assert_bad_request(ifeval.post("/verify", json=verify_body(text, instruction_id_list=["words:start_verb"],
                                                               kwargs=[{}])), "words:start_verb", "not supported")


def test_ifeval_batch_items_fail_alone_and_aggregate(ifeval):
    good = verify_body("fine", instruction_id_list=["punctuation:no_comma"], kwargs=[{}])
    bad = verify_body("fine", instruction_id_list=["made:up"], kwargs=[{}])
    replies = ifeval.post("/verify/batch", json=[good | {"_ng_task_index": 0, "_ng_rollout_index": 0}, bad,
                                                 good | {"_ng_task_index": 0, "_ng_rollout_index": 1}]).json()
    assert [r["reward"] for r in replies] == [1.0, 0.0, 1.0]
    assert replies[1]["failure_kind"] == "bad_request" and "made:up" in replies[1]["failure_reason"]
    metrics = ifeval.post("/aggregate_metrics", json={"verify_responses": replies}).json()
    assert metrics["failures"] == {"bad_request": 1} and metrics["num_scored"] == 2


# --------------------------------------------------------------------------- #
# reasoning_gym
# --------------------------------------------------------------------------- #
def test_rgym_example_rows(rgym):
    rows = examples("reasoning_gym")
    right = [body_for(r, f"Let me think.\n<answer>{r['reasoning_gym_entry']['answer']}</answer>") for r in rows]
    wrong = [body_for(r, "<answer>no idea</answer>") for r in rows]
    replies = rgym.post("/verify/batch", json=right + wrong).json()
    assert [r["reward"] for r in replies[:len(rows)]] == [1.0] * len(rows)
    assert all(r["reward"] < 1.0 and r["extracted_answer"] == "no idea" for r in replies[len(rows):])
    assert {r["task_name"] for r in replies} == {"chain_sum", "spell_backward", "leg_counting"}


def test_rgym_nemo_gym_row_shape(rgym):
    entry = examples("reasoning_gym")[0]["reasoning_gym_entry"]
    body = verify_body(f"\\boxed{{{entry['answer']}}}", question=entry["question"], answer=entry["answer"],
                       metadata=entry["metadata"])
    reply = rgym.post("/verify", json=body).json()
    assert reply["reward"] == 1.0 and reply["task_name"] == "chain_sum"


def test_rgym_bad_input(rgym):
    entry = examples("reasoning_gym")[0]["reasoning_gym_entry"]
    assert_bad_request(rgym.post("/verify", json=verify_body("1")), "reasoning_gym_entry")
    assert_bad_request(rgym.post("/verify", json=verify_body("1", reasoning_gym_entry="x")), "reasoning_gym_entry")
    assert_bad_request(rgym.post("/verify", json=verify_body("1", task_name="nope", reasoning_gym_entry=entry)),
                       "nope")
    reply = rgym.post("/verify", json=no_text_body(reasoning_gym_entry=entry, task_name="chain_sum")).json()
    assert reply["reward"] == 0.0 and reply.get("mask_sample") is False
    reply = rgym.post("/verify", json=verify_body(ONE_MB, reasoning_gym_entry=entry)).json()
    assert reply["reward"] == 0.0 and "max_response_chars" in reply["reward_reason"]
    metrics = rgym.post("/aggregate_metrics", json=[reply, reply | {"reward": 1.0}]).json()
    assert metrics["reward"]["mean"] == 0.5


def test_rgym_scorer_failure_is_masked_not_zero(rgym):
    """`composite` cannot build a scorer without a config: the worker raises, the reply is masked."""
    body = verify_body("<answer>1</answer>", task_name="composite",
                       reasoning_gym_entry={"question": "q", "answer": "1", "metadata": {}})
    reply = rgym.post("/verify", json=body).json()
    assert reply["mask_sample"] is True and reply["failure_kind"] == "crash"
    assert "composite" in reply["failure_reason"]
    entry = examples("reasoning_gym")[0]["reasoning_gym_entry"]
    assert rgym.post("/verify", json=verify_body(f"<answer>{entry['answer']}</answer>",
                                                 reasoning_gym_entry=entry)).json()["reward"] == 1.0


WEIRD = [None, 1, -1, 1.5, True, "", "x", [], [None], [1, "a"], {}, {"a": None}, [{"A": None}], {"A": 1, "": 2},
         [[1]], {"nested": {"x": [1]}}]
GOOD_ROWS = {
    "jaccard": {"expected_answer": "x"},
    "mcqa": {"options": {"A": "x", "B": "y"}, "expected_answer": "A"},
    "ifeval": {"instruction_id_list": ["keywords:frequency"],
               "kwargs": [{"keyword": "x", "frequency": 1, "relation": "at least"}]},
    "rgym": {"task_name": "chain_sum", "reasoning_gym_entry": {"question": "1+1", "answer": "2",
                                                              "metadata": {"source_dataset": "chain_sum"}}},
}


@pytest.mark.parametrize("fixture", list(GOOD_ROWS))
def test_wrong_types_in_any_field_never_500(fixture, request):
    """Every row field set to each odd JSON value: a 400 or a reply, never a 500, and batches survive."""
    server: ServerProcess = request.getfixturevalue(fixture)
    good = GOOD_ROWS[fixture]
    names = list(good) + ["grading_mode", "template_metadata", "metadata", "reasoning_gym_dataset", "ground_truth"]
    bodies = [verify_body("Answer: A <answer>2</answer>", **{**good, name: value})
              for name in names for value in WEIRD]
    bodies += [verify_body("x", **good) | {"response": {"output": [{"type": "message", "role": "assistant",
                                                                    "content": value}]}} for value in WEIRD]
    with httpx.Client(base_url=server.url, headers=server.headers(), timeout=60.0) as client:  # keep-alive
        for body in bodies:
            reply = client.post("/verify", json=body)
            assert reply.status_code in (200, 400), (body, reply.text)
            if reply.status_code == 200:
                assert reply.json().get("failure_kind") != "crash", (body, reply.text)
    replies = server.post("/verify/batch", json=bodies)
    assert replies.status_code == 200 and len(replies.json()) == len(bodies)
