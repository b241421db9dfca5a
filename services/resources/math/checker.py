"""Math checks that run inside worker processes (never on the event loop or in threads).

`score` reproduces NeMo RL's math environment: math-verify's `math_metric` with gold
extraction `LatexExtractionConfig` on `"\\boxed{" + expected + "}"` and prediction
extraction (`ExprExtractionConfig`, `LatexExtractionConfig`) on the response. It is the
same sequence of math-verify calls as `math_metric`'s sample function (parse both,
`verify(gold, pred, 6)`, max over predictions) written out so that math-verify's own
SIGALRM timeout can be set per call and so that a timeout, which math-verify swallows
and only logs, is noticed and reported instead of passing as an ordinary wrong answer.
"""
from __future__ import annotations

import logging
import re
from typing import Any

OK = "ok"
TIMEOUT = "timeout"
BAD_GOLD = "bad_gold"

_GOLD_TARGETS: tuple[Any, ...] = ()
_PRED_TARGETS: tuple[Any, ...] = ()


class _TimeoutRecorder(logging.Handler):
    """Counts math-verify's "Timeout during ..." warnings (it logs timeouts instead of raising)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.msg
        if isinstance(msg, str) and msg.startswith("Timeout"):
            self.count += 1


_recorder = _TimeoutRecorder()
_NUMBER = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)")


def init_worker() -> None:
    """Worker initializer: import math-verify/sympy and warm them so the first request is fast."""
    global _GOLD_TARGETS, _PRED_TARGETS
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    _GOLD_TARGETS = (LatexExtractionConfig(),)
    _PRED_TARGETS = (ExprExtractionConfig(), LatexExtractionConfig())
    logger = logging.getLogger("math_verify")
    logger.setLevel(logging.WARNING)
    logger.propagate = False  # silence: a 1 MB response must not be echoed into the server log
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.addHandler(_recorder)
    # exercise the latex, expression and comparison paths once (sympy's lazy imports)
    score("The answer is $\\frac{1}{2}$", "0.5", 5)
    score("so x = 3", "x^2+1", 5)


def _targets() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    if not _GOLD_TARGETS:
        init_worker()
    return _GOLD_TARGETS, _PRED_TARGETS


def _pick_extracted(golds: list[Any], preds: list[Any], timeout_s: int) -> str | None:
    """The prediction shown as `extracted_answer`: NeMo RL's choice (the first predicted string
    that matches a gold string, else the first prediction), without its first-character slip."""
    from math_verify.errors import TimeoutException
    from math_verify.grader import verify
    from math_verify.utils import timeout

    @timeout(timeout_s)
    def as_strings() -> tuple[list[str], list[str]]:
        return [str(g) for g in golds], [str(p) for p in preds]  # sympy str() can be slow

    try:
        gold_strs, pred_strs = as_strings()
    except (Exception, TimeoutException):
        return None
    for pred in pred_strs:
        if any(verify(gold, pred, timeout_seconds=timeout_s) for gold in gold_strs):
            return pred
    return pred_strs[0] if pred_strs else None


def written_as_number(extracted: str | None) -> bool:
    """True for "7", "-2.5", "$7$"; False for "3 + 4" (an expression that merely equals the answer)."""
    return extracted is not None and _NUMBER.fullmatch(extracted.strip().strip("$").strip()) is not None


def score(response: str, expected: str, timeout_s: int = 5,
          number_only: bool = False) -> tuple[float, str | None, str]:
    """(reward 1.0/0.0, extracted answer, status). Status `bad_gold`: expected gives no target;
    `timeout`: a math-verify timeout fired and the answer was not found correct. `number_only`
    scores a correct answer only when it is written as a number (the extracted text)."""
    from math_verify.grader import verify
    from math_verify.parser import parse

    gold_targets, pred_targets = _targets()
    before = _recorder.count
    golds = parse("\\boxed{" + expected + "}", gold_targets, parsing_timeout=timeout_s)
    if not golds:
        return 0.0, None, (TIMEOUT if _recorder.count > before else BAD_GOLD)
    preds = parse(response, pred_targets, parsing_timeout=timeout_s)
    reward = 1.0 if preds and verify(golds, preds, 6, timeout_seconds=timeout_s) else 0.0
    timed_out = _recorder.count > before
    extracted = _pick_extracted(golds, preds, timeout_s) if preds else None
    if number_only and not written_as_number(extracted):
        reward = 0.0
    if reward == 0.0 and timed_out:
        return 0.0, extracted, TIMEOUT
    return reward, extracted, OK


def score_many(items: list[tuple[str, str, bool]], timeout_s: int = 5) -> list[tuple[float, str | None, str]]:
    """`score` over a chunk of (response, expected, number_only) items in one round trip."""
    return [score(response, expected, timeout_s, number_only) for response, expected, number_only in items]


def equivalent(answer: str, expected: str, timeout_s: int = 5) -> tuple[bool, str]:
    """math-verify equivalence of two short answers, both boxed (NeMo RL's `math_expression_reward`)."""
    reward, _, status = score("\\boxed{" + answer + "}", expected, timeout_s)
    return reward == 1.0, status
