"""Judged environments against a scripted OpenAI-compatible judge on 127.0.0.1 (`models/stub` with
prompt rules): exact outcomes for a judge that is right, wrong, order-dependent, unparseable, slow,
killed mid-request or rate-limited (429 with Retry-After); the cache and the token bucket are checked
by counting calls at the judge. One slow test uses the real embedded `models/hf` model as the judge.
"""
from __future__ import annotations

import json
import threading

import httpx
import pytest

from gymserve.testing import ServerProcess, response_with_text

A_FIRST = r"Assistant A's Answer\|>\n"  # math's prompt: what follows is the first answer shown
EQUAL = "My final verdict is [[A=B]]"
DIFFERENT = "My final verdict is [[A!=B]]"
RULES = [
    {"match": "RATELIMITED_ONCE", "times": 1, "status": 429, "retry_after": 1, "error": "slow down"},
    {"match": "RATELIMITED_LONG", "status": 429, "retry_after": 120, "error": "slow down"},
    {"match": "FLAKY", "times": 1, "status": 503, "error": "overloaded"},
    {"match": A_FIRST + "ORDERDEP", "text": DIFFERENT},   # the judge flips when the answers swap
    {"match": "GARBLE", "text": "They look the same to me."},
    {"match": "CONFLICT", "text": "Either [[A=B]] or [[A!=B]], hard to say."},
    {"match": "SLOWPOKE", "sleep": 60, "text": EQUAL},
    {"match": "HANGUP", "sleep": 60, "text": EQUAL},
    {"match": "SLOWISH", "sleep": 3, "text": EQUAL},
    {"match": "seven|Lamarck", "text": DIFFERENT},
    {"match": ".", "text": EQUAL},
]


def _judge(*overrides: str) -> ServerProcess:
    return ServerProcess("models/stub", *overrides, name="judge_stub",
                         env={"GYMSERVE_SERVER_SPEC": json.dumps({"rules": RULES})})


@pytest.fixture(scope="module")
def judge():
    with _judge() as proc:
        yield proc


@pytest.fixture(scope="module")
def math(judge):
    with ServerProcess("resources/math", "workers=1", "should_use_judge=true", f"judge_model_server={judge.url}",
                       "judge_deadline_s=4", "judge_backoff_s=0.05") as proc:
        yield proc


def _calls(judge: ServerProcess) -> int:
    return judge.get("/stats").json()["calls"]


def _math(server: ServerProcess, answer: str, expected: str = "\\frac{1}{2}") -> dict:
    body = {"responses_create_params": {"input": [{"role": "user", "content": "Half of one?"}]},
            "question": "What is half of one?", "expected_answer": expected,
            "response": response_with_text(f"So the answer is \\boxed{{{answer}}}.")}
    r = server.post("/verify", body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_math_judge_off_by_default_scores_as_before(judge) -> None:
    with ServerProcess("resources/math", "workers=1", f"judge_model_server={judge.url}") as plain:
        before = _calls(judge)
        reply = _math(plain, "one half")
        assert reply["reward"] == 0.0 and not reply["mask_sample"]
        assert "judge_evaluations" not in reply and "library_reward" not in reply
        assert _calls(judge) == before


def test_math_verify_decides_without_judge(math, judge) -> None:
    before = _calls(judge)
    reply = _math(math, "0.5")
    assert reply["reward"] == 1.0 and reply["library_reward"] == 1.0
    assert reply.get("judge_evaluations") is None
    assert _calls(judge) == before


def test_math_judge_equal_in_both_orders(math, judge) -> None:
    before = _calls(judge)
    reply = _math(math, "one half")
    assert reply["reward"] == 1.0 and reply["library_reward"] == 0.0 and not reply["mask_sample"]
    evaluations = reply["judge_evaluations"]
    assert [e["verdict_label"] for e in evaluations] == ["[[A=B]]", "[[A=B]]"]
    first, second = (e["responses_create_params"]["input"][-1]["content"] for e in evaluations)
    assert first.index("\\frac{1}{2}") < first.index("one half") and second.index("one half") < second.index("\\frac")
    assert _calls(judge) == before + 2


def test_math_judge_says_different_once(math, judge) -> None:
    reply = _math(math, "seven")
    assert reply["reward"] == 0.0 and not reply["mask_sample"]
    assert [e["verdict_label"] for e in reply["judge_evaluations"]] == ["[[A!=B]]"]


def test_math_order_dependent_judge_scores_zero(math) -> None:
    reply = _math(math, "ORDERDEP")
    assert reply["reward"] == 0.0 and not reply["mask_sample"]
    assert [e["verdict_label"] for e in reply["judge_evaluations"]] == ["[[A=B]]", "[[A!=B]]"]


@pytest.mark.parametrize("answer, reason", [("GARBLE", "no verdict label"), ("CONFLICT", "conflicting verdict")])
def test_math_unparseable_verdict_is_masked(math, answer, reason) -> None:
    reply = _math(math, answer)
    assert reply["mask_sample"] is True and reply["failure_kind"] == "upstream"
    assert reason in reply["failure_reason"]
    assert reply["judge_evaluations"][-1]["verdict_label"] is None


def test_math_slow_judge_is_a_masked_timeout(math) -> None:
    reply = _math(math, "SLOWPOKE")
    assert reply["mask_sample"] is True and reply["failure_kind"] == "timeout"
    assert "judge_deadline_s" in reply["failure_reason"]


def test_math_429_retry_after_is_honoured(math, judge) -> None:
    before = _calls(judge)
    reply = _math(math, "RATELIMITED_ONCE")
    assert reply["reward"] == 1.0 and len(reply["judge_evaluations"]) == 2
    assert _calls(judge) == before + 3  # the 429, then both orders
    # a Retry-After past the deadline: no retry is sent at all, the sample is a masked timeout
    before = _calls(judge)
    reply = _math(math, "RATELIMITED_LONG")
    assert reply["mask_sample"] is True and reply["failure_kind"] == "timeout"
    assert "no room for a retry" in reply["failure_reason"] and "429" in reply["failure_reason"]
    assert _calls(judge) == before + 1
    before = _calls(judge)  # a 503 is retried like a connection error
    assert _math(math, "FLAKY")["reward"] == 1.0 and _calls(judge) == before + 3


def test_cache_answers_a_reverify_without_calling_the_judge(math, judge) -> None:
    first = _math(math, "a half")
    before = _calls(judge)
    again = _math(math, "a half")
    assert _calls(judge) == before
    assert again["reward"] == first["reward"] == 1.0
    assert again["judge_evaluations"] == first["judge_evaluations"]  # a re-verify gives the same reply
    metrics = math.get("/metrics").text
    assert f'gymserve_judge_cache_hits_total{{judge="{judge.url}"}}' in metrics
    assert f'gymserve_judge_calls_total{{judge="{judge.url}",outcome="ok"}}' in metrics
    assert 'gymserve_judge_verdicts_total' in metrics and 'reason="unparseable"' in metrics


def test_math_batch_judges_each_item(math) -> None:
    bodies = [{"responses_create_params": {"input": [{"role": "user", "content": "Half?"}]},
               "expected_answer": "\\frac{1}{2}", "response": response_with_text(f"\\boxed{{{a}}}")}
              for a in ("1/2", "half of one", "seven", "GARBLE")]
    out = math.post("/verify/batch", bodies, timeout=60).json()
    assert [r["reward"] for r in out] == [1.0, 1.0, 0.0, 0.0]
    assert [r["mask_sample"] for r in out] == [False, False, False, True]
    assert [len(r.get("judge_evaluations") or []) for r in out] == [0, 2, 1, 1]


def _equivalence_body(answer: str, expected: str = "Charles Darwin") -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": "Who proposed natural selection?"}]},
            "expected_answer": expected, "response": response_with_text(answer)}


def test_equivalence_judge(judge) -> None:
    with ServerProcess("resources/equivalence_llm_judge", f"judge_model_server={judge.url}",
                       "check_twice_swap=true", "judge_deadline_s=4") as env:
        right = env.post("/verify", _equivalence_body("Darwin")).json()
        assert right["reward"] == 1.0 and right["extracted_answer"] == "Darwin"
        assert len(right["judge_evaluations"]) == 2
        prompt = right["judge_evaluations"][0]["responses_create_params"]["input"][-1]["content"]
        assert "Who proposed natural selection?" in prompt and prompt.index("Charles Darwin") < prompt.index("\nDarwin")
        wrong = env.post("/verify", _equivalence_body("Lamarck")).json()
        assert wrong["reward"] == 0.0 and len(wrong["judge_evaluations"]) == 1 and not wrong["mask_sample"]
        empty = env.post("/verify", _equivalence_body("  ")).json()
        assert empty["reward"] == 0.0 and empty["judge_evaluations"] == [] and not empty["mask_sample"]
        garbled = env.post("/verify", _equivalence_body("GARBLE")).json()
        assert garbled["mask_sample"] is True and garbled["failure_kind"] == "upstream"
        missing = env.post("/verify", {**_equivalence_body("Darwin"), "expected_answer": None})
        assert missing.status_code == 400 and "expected_answer" in missing.text


def test_judge_killed_mid_request_and_rate_limit() -> None:
    """A judge process killed while answering masks the sample (upstream); a token bucket of one call
    per 10 s lets the first question through and times out the second, counted at the judge; a
    concurrency bound of one serializes judge calls."""
    with _judge() as dying, ServerProcess("resources/equivalence_llm_judge", f"judge_model_server={dying.url}",
                                          "judge_deadline_s=20", "judge_retries=1", "judge_backoff_s=0.05") as env:
        result: dict = {}
        worker = threading.Thread(target=lambda: result.update(
            reply=env.post("/verify", _equivalence_body("HANGUP"), timeout=60).json()))
        worker.start()
        with httpx.Client() as http:  # wait until the judge holds the request, then kill it
            for _ in range(200):
                if http.get(f"{dying.url}/stats").json()["calls"] >= 1:
                    break
                threading.Event().wait(0.05)
        dying.proc.kill()  # type: ignore[union-attr]
        worker.join(60)
        reply = result["reply"]
        assert reply["mask_sample"] is True and reply["failure_kind"] == "upstream"
    with _judge() as judge, ServerProcess("resources/equivalence_llm_judge", f"judge_model_server={judge.url}",
                                          "check_twice_swap=true", "judge_rate_per_s=0.1", "judge_deadline_s=2") as env, \
            ServerProcess("resources/equivalence_llm_judge", f"judge_model_server={judge.url}", "check_twice_swap=false",
                          "judge_endpoint_max_concurrency=1", "judge_deadline_s=5", name="one_at_a_time") as serial:
        # one judge call at a time: the second question waits for the first (3 s), leaving it too little of
        # its 5 s deadline; unbounded, both would be answered
        out = serial.post("/verify/batch", [_equivalence_body("SLOWISH a"), _equivalence_body("SLOWISH b")]).json()
        assert sorted(str(r.get("failure_kind")) for r in out) == ["None", "timeout"], out
        reply = env.post("/verify", _equivalence_body("Darwin")).json()
        assert reply["mask_sample"] is True and reply["failure_kind"] == "timeout"
        assert "rate limit" in reply["failure_reason"]
        assert [e["verdict_label"] for e in reply["judge_evaluations"]] == ["[[A=B]]"]
        assert _calls(judge) == 3  # the rate-limited question, then the two serial ones


def test_judge_config_errors_name_the_option(judge) -> None:
    for bad, option in ((("should_use_judge=true",), "should_use_judge"),
                        (("should_use_judge=true", f"judge_model_server={judge.url}",
                          "judge_prompt_template={question} {answer}"), "judge_prompt_template")):
        proc = ServerProcess("resources/math", "workers=1", *bad, ready_timeout_s=60)
        with pytest.raises(RuntimeError, match=option):
            proc.start()


@pytest.mark.slow
def test_real_hf_judge() -> None:
    """The embedded CPU model as the judge: a real generation comes back and is parsed strictly, so the
    reply is a verdict with its evaluations or a masked `upstream` failure, never a silent 0."""
    with ServerProcess("models/hf", "default_max_tokens=24", name="judge_hf", ready_timeout_s=600) as hf, \
            ServerProcess("resources/equivalence_llm_judge", f"judge_model_server={hf.url}",
                          "judge_deadline_s=300", "judge_responses_create_params={temperature: 0}") as env:
        reply = env.post("/verify", _equivalence_body("Darwin"), timeout=600).json()
        evaluations = reply["judge_evaluations"]
        assert evaluations and evaluations[0]["response"]["output"], reply
        assert "generation_token_ids" not in evaluations[0]["response"]["output"][-1]  # the policy's token data
        if reply["mask_sample"]:
            assert reply["failure_kind"] == "upstream" and "verdict label" in reply["failure_reason"]
        else:
            assert reply["reward"] in (0.0, 1.0) and evaluations[0]["verdict_label"] in ("[[A=B]]", "[[A!=B]]")
        metrics = env.get("/metrics").text
        assert f'gymserve_judge_calls_total{{judge="{hf.url}",outcome="ok"}} 1.0' in metrics or \
            f'gymserve_judge_calls_total{{judge="{hf.url}",outcome="ok"}} 2.0' in metrics


def test_rubric_judge_scores_and_components() -> None:
    rules = [{"match": r"\[Rubric\]\nform", "text": "Form is off. [[4]]"},
             {"match": r"\[Rubric\]\ntopic", "text": "On topic. [[10]]"},
             {"match": "GARBLE", "text": "Pretty good, 8 out of 10."},
             {"match": "OUTOFSCALE", "text": "[[11]]"},
             {"match": ".", "text": "Good. [[score: 7]]"}]
    with ServerProcess("models/stub", name="judge_stub", env={"GYMSERVE_SERVER_SPEC": json.dumps({"rules": rules})}) \
            as judge, ServerProcess("resources/llm_judge", f"judge_model_server={judge.url}", "score_min=1",
                                    "score_max=10", "rubric=Answers the question.") as env:
        def verify(text: str, **row) -> dict:
            body = {"responses_create_params": {"input": [{"role": "user", "content": "Write a haiku."}]},
                    "response": response_with_text(text), **row}
            return env.post("/verify", body).json()

        default = verify("a poem")
        assert default["reward"] == pytest.approx(6 / 9) and default["judge_scores"] == {"rubric": 7.0}
        items = [{"name": "form", "criterion": "form: 5-7-5", "weight": 1},
                 {"name": "topic", "criterion": "topic: autumn", "weight": 3}]
        split = verify("a poem", rubric=items)
        assert split["reward_components"] == pytest.approx({"form": 0.25 * 3 / 9, "topic": 0.75})
        assert split["reward"] == pytest.approx(0.25 * 3 / 9 + 0.75) and len(split["judge_evaluations"]) == 2
        for text in ("GARBLE", "OUTOFSCALE"):
            masked = verify(text)
            assert masked["mask_sample"] is True and masked["failure_kind"] == "upstream"
        bad = env.post("/verify", {"response": response_with_text("x"), "rubric": [{"name": "a"}]})
        assert bad.status_code == 400 and "rubric" in bad.text


def test_genrm_pairwise_group_and_reference() -> None:
    rules = [{"match": r"Response A\|>\nBEST", "text": "[[A>B]]"}, {"match": r"Response B\|>\nBEST", "text": "[[B>A]]"},
             {"match": r"Response A\|>\nWORST", "text": "[[B>A]]"}, {"match": r"Response B\|>\nWORST", "text": "[[A>B]]"},
             {"match": ".", "text": "[[A=B]]"}]
    with ServerProcess("models/stub", name="judge_stub", env={"GYMSERVE_SERVER_SPEC": json.dumps({"rules": rules})}) \
            as judge, ServerProcess("resources/genrm_compare", f"judge_model_server={judge.url}") as env:
        prompt = {"input": [{"role": "user", "content": "Say something."}]}
        group = [{"responses_create_params": prompt, "response": response_with_text(t)} for t in ("BEST", "MID", "WORST")]
        out = env.post("/verify/batch", group).json()
        assert [r["reward"] for r in out] == [1.0, 0.5, 0.0]
        assert [r["genrm_questions"] for r in out] == [4, 4, 4] and _calls(judge) == 6
        single = env.post("/verify", {**group[0], "reference_response": "MID"}).json()
        assert single["reward"] == 1.0 and len(single["judge_evaluations"]) == 2
        missing = env.post("/verify", group[1])
        assert missing.status_code == 400 and "reference_response" in missing.text


def test_judge_named_by_instance_is_resolved_through_the_head(tmp_path) -> None:
    """`judge_model_server: {type, name}` in a stack: found through the head's registry, called with the
    stack's API key, reached here through the head's proxy."""
    from tests.integration.up_helpers import Up

    stack = {"head": {"host": "127.0.0.1", "port": 0}, "servers": {
        "judge_model": {"kind": "models/stub", "rules": RULES},
        "equivalence": {"kind": "resources/equivalence_llm_judge", "check_twice_swap": True,
                        "judge_model_server": {"type": "responses_api_models", "name": "judge_model"}}}}
    (tmp_path / "stack.yaml").write_text(json.dumps(stack))
    key = "judge-test-key"
    launcher = Up("-c", str(tmp_path / "stack.yaml"), env={"GYMSERVE_API_KEY": key})
    try:
        launcher.wait_for(r"all 3 servers ready")
        head = launcher.wait_for(r"head on (http://\S+)").group(1)
        auth = {"Authorization": f"Bearer {key}"}
        right = httpx.post(f"{head}/servers/equivalence/verify", json=_equivalence_body("Darwin"), headers=auth,
                           timeout=60).json()
        assert right["reward"] == 1.0 and len(right["judge_evaluations"]) == 2, right
        wrong = httpx.post(f"{head}/servers/equivalence/verify", json=_equivalence_body("Lamarck"), headers=auth,
                           timeout=60).json()
        assert wrong["reward"] == 0.0 and not wrong["mask_sample"]
        judge_stats = None
        for _ in range(120):  # the head samples /metrics every few seconds: the dashboard shows the judge
            data = httpx.get(f"{head}/dashboard/data", headers=auth, timeout=30).json()
            judge_stats = next((e["judge"] for e in data["environments"] if e["name"] == "equivalence"), None)
            if judge_stats and judge_stats.get("calls") == 3:
                break
            threading.Event().wait(0.25)
        assert judge_stats == {"calls": 3.0}, judge_stats  # no cache hit, no failure yet: no such series
    finally:
        launcher.kill()


def test_judge_answering_an_error_or_not_a_model_is_masked(judge) -> None:
    """A judge URL whose server has no such endpoint (404: not retried) or is not listening at all."""
    from services.core.ports import free_port

    with ServerProcess("resources/equivalence_llm_judge", f"judge_model_server={judge.url}",
                       "judge_api=chat_completions", "judge_deadline_s=5") as wrong_api:
        reply = wrong_api.post("/verify", _equivalence_body("Darwin")).json()
        assert reply["mask_sample"] is True and reply["failure_kind"] == "upstream" and "404" in reply["failure_reason"]
    with ServerProcess("resources/equivalence_llm_judge", f"judge_model_server=http://127.0.0.1:{free_port()}",
                       "judge_retries=1", "judge_backoff_s=0.05", "judge_deadline_s=10") as nobody:
        reply = nobody.post("/verify", _equivalence_body("Darwin")).json()
        assert reply["mask_sample"] is True and reply["failure_kind"] == "upstream" and reply["judge_evaluations"] == []


def test_identical_questions_in_flight_share_one_judge_call(math, judge) -> None:
    body = {"responses_create_params": {"input": [{"role": "user", "content": "Half?"}]},
            "expected_answer": "\\frac{1}{2}", "response": response_with_text("\\boxed{one over two}")}
    before = _calls(judge)
    out = math.post("/verify/batch", [body] * 4, timeout=60).json()
    assert [r["reward"] for r in out] == [1.0] * 4
    assert _calls(judge) == before + 2  # both orders, once for all four


def test_a_shared_question_outlives_the_request_that_asked_it_first(math, judge) -> None:
    """A request that gives up (its client disconnects) is cancelled with its judge call; a request
    sharing that question asks it again and gets its verdict, not the first one's cancellation."""
    body = {"responses_create_params": {"input": [{"role": "user", "content": "Half?"}]},
            "expected_answer": "\\frac{1}{2}", "response": response_with_text("\\boxed{SLOWISH one over two}")}
    before = _calls(judge)
    gave_up = threading.Event()

    def impatient() -> None:  # gives up before the judge's first answer (it takes 3 s)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{math.url}/verify", json=body, headers=math.headers(), timeout=httpx.Timeout(30, read=2.5))
        gave_up.set()

    first = threading.Thread(target=impatient)
    first.start()
    try:
        for _ in range(250):  # the first request's judge call has reached the judge: it is the one shared
            if _calls(judge) > before:
                break
            threading.Event().wait(0.02)
        assert _calls(judge) == before + 1
        reply = math.post("/verify", body, timeout=60).json()
    finally:
        first.join()
    assert gave_up.is_set()
    assert reply["reward"] == 1.0 and not reply["mask_sample"], reply
    assert _calls(judge) == before + 3  # the cancelled first call, then both orders for the second
