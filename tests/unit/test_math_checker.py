"""The math checker's scoring (real math-verify, run in this test process's main thread)."""
from __future__ import annotations

import pytest
from math_verify import ExprExtractionConfig, LatexExtractionConfig, math_metric

from services.core.errors import BadRequest
from services.resources.math import checker
from services.resources.math.app import balanced_braces

CASES = [
    ("The answer is $\\boxed{42}$.", "42"),
    ("so we get 41", "42"),
    ("The answer is 0.5", "\\frac{1}{2}"),
    ("Therefore $\\frac{1}{2}$", "0.5"),
    ("The result is $x^2 + 2x + 1$", "(x+1)^2"),
    ("We get $\\boxed{5\\sqrt{2}}$", "\\sqrt{50}"),
    ("I have no idea.", "7"),
    ("Final answer: 3, 4", "\\{3, 4\\}"),
    ("", "1"),
]


@pytest.fixture(scope="module", autouse=True)
def _init() -> None:
    checker.init_worker()


@pytest.mark.parametrize("response,expected", CASES)
def test_score_agrees_with_math_metric(response: str, expected: str) -> None:
    """Same reward as NeMo RL's configuration of math-verify's math_metric."""
    metric = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                         pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
    want, _ = metric(["\\boxed{" + expected + "}"], [response])
    reward, _, status = checker.score(response, expected, 5)
    assert status == checker.OK
    assert reward == want


def test_correct_wrong_and_equivalent_forms() -> None:
    assert checker.score("The answer is \\boxed{42}", "42")[0] == 1.0
    assert checker.score("The answer is \\boxed{43}", "42")[0] == 0.0
    assert checker.score("It is 0.5", "\\frac{1}{2}")[0] == 1.0
    assert checker.score("It is $\\frac{1}{2}$", "0.5")[0] == 1.0
    assert checker.score("It is $\\frac{2}{3}$", "0.5")[0] == 0.0


def test_extracted_answer() -> None:
    reward, extracted, _ = checker.score("so the final answer is \\boxed{17}.", "17")
    assert (reward, extracted) == (1.0, "17")
    reward, extracted, _ = checker.score("so the final answer is \\boxed{18}.", "17")
    assert (reward, extracted) == (0.0, "18")
    assert checker.score("no numbers here at all", "17")[1] is None


@pytest.mark.parametrize("gold", ["}{", "$", "\\boxed{"])
def test_unparsable_gold_is_reported(gold: str) -> None:
    assert checker.score("42", gold)[2] == checker.BAD_GOLD


def test_pathological_expression_hits_math_verify_timeout() -> None:
    reward, _, status = checker.score("The answer is \\boxed{9^{9^{9^{9}}}}", "7", 1)
    assert (reward, status) == (0.0, checker.TIMEOUT)
    # the next check is unaffected
    assert checker.score("\\boxed{7}", "7", 1) == (1.0, "7", checker.OK)


def test_score_many_matches_score() -> None:
    items = [(r, e) for r, e in CASES]
    assert checker.score_many([(r, e, False) for r, e in items], 5) == [checker.score(r, e, 5) for r, e in items]
    assert checker.score_many([(r, e, True) for r, e in items], 5) == [checker.score(r, e, 5, True) for r, e in items]


@pytest.mark.parametrize("response, reward", [
    ("3 + 4 = 7", 1.0), ("The answer is 7.", 1.0), ("$7$", 1.0), ("\\boxed{7}", 1.0),
    ("To add 3 + 4,", 0.0),  # restating the sum: equal to 7 for math-verify, not an answer
    ("\\boxed{3+4}", 0.0), ("3 + 4 = 8", 0.0)])
def test_number_only_needs_the_answer_written_as_a_number(response: str, reward: float) -> None:
    assert checker.score(response, "7", 5, True)[0] == reward
    assert checker.score("To add 3 + 4,", "7", 5)[0] == 1.0  # the default (NeMo RL) accepts the expression


def test_equivalent() -> None:
    assert checker.equivalent("1/2", "0.5")[0]
    assert not checker.equivalent("3", "4")[0]


@pytest.mark.parametrize("gold", ["\\frac{", "}{", "{", "a}", "\\sqrt{2"])
def test_unbalanced_braces_are_rejected_before_math_verify(gold: str) -> None:
    with pytest.raises(BadRequest, match="expected_answer.*unbalanced"):
        balanced_braces(gold)


@pytest.mark.parametrize("gold", ["\\frac{1}{2}", "\\{1,2\\}", "0.\\overline{3}", "42", "\\\\"])
def test_balanced_golds_pass(gold: str) -> None:
    assert balanced_braces(gold) == gold
