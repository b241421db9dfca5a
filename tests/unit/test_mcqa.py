"""mcqa extraction: option shapes, patterns, validity of letters, NeMo-Gym grading modes."""
from __future__ import annotations

import pytest

from services.resources.mcqa.extract import (DEFAULT_PATTERNS, GRADING_MODES, OptionsError, compile_patterns,
                                             extract_letter, normalize_expected, normalize_options)

OPTIONS = {"A": "Circle", "B": "Square", "C": "Triangle", "D": "Hexagon"}
DEFAULT = compile_patterns(DEFAULT_PATTERNS)


def pick(text: str, options: dict[str, str] = OPTIONS) -> str | None:
    return extract_letter(text, options, DEFAULT)


def test_option_shapes_are_normalized():
    assert normalize_options([{"A": "x"}, {"b": "y"}]) == {"A": "x", "B": "y"}
    assert normalize_options({"A": "x", "B": "y"}) == {"A": "x", "B": "y"}
    assert normalize_options(["x", "y", "z"]) == {"A": "x", "B": "y", "C": "z"}


@pytest.mark.parametrize("bad", [[], {}, "ABCD", [{"AB": "x"}], [{"1": "x"}], [1, {"A": "x"}], None, 7])
def test_bad_options_raise_naming_the_field(bad):
    with pytest.raises(OptionsError, match="options"):
        normalize_options(bad)


def test_expected_letter_must_be_an_option():
    assert normalize_expected(" c ", OPTIONS) == "C"
    for bad in ("E", "AB", "", None, 3):
        with pytest.raises(OptionsError, match="expected_answer"):
            normalize_expected(bad, OPTIONS)


@pytest.mark.parametrize("text,letter", [
    ("Answer: B", "B"),
    ("answer: b", "B"),
    ("The answer is: (C)", "C"),
    ("Final Answer: **D**", "D"),
    ("I pick \\boxed{A}.", "A"),
    ("\\boxed{\\text{C}}", "C"),
    ("\\boxed{ (B) }", "B"),
    ("After thinking, the best option is B", "B"),
    ("Reasoning...\n\nC.", "C"),
    ("(A)", "A"),
    ("A is wrong, so Answer: C", "C"),
    ("Answer: A\n...wait, I change my mind.\nAnswer: D", "D"),
    ("The answer is B because it fits.", "B"),
    ("The answer is **C**, clearly.", "C"),
])
def test_default_patterns(text, letter):
    assert pick(text) == letter


@pytest.mark.parametrize("text", [
    "I don't know",
    "Answer: E",                      # not an option
    "\\boxed{Z}",
    "the answer is a circle",         # lowercase article is no final letter
    "Consider option A\nIt is wrong.\nI am unsure.",  # a letter ending an earlier line is not final
    "",
])
def test_nothing_valid_extracted(text):
    assert pick(text) is None


def test_invalid_letter_falls_through_to_later_pattern():
    # "Answer: E" is invalid; the boxed C is valid
    assert pick("Answer: E \\boxed{C}") == "C"


def test_earlier_pattern_wins_over_later():
    assert pick("Answer: A \\boxed{B}") == "A"


def test_custom_patterns():
    custom = compile_patterns([r"<choice>([A-Z])</choice>"])
    assert extract_letter("<choice>B</choice> Answer: C", OPTIONS, custom) == "B"
    assert extract_letter("Answer: C", OPTIONS, custom) is None


def test_pattern_without_group_or_invalid_is_rejected():
    with pytest.raises(ValueError, match="capture group"):
        compile_patterns([r"Answer: [A-Z]"])
    with pytest.raises(ValueError, match="invalid regex"):
        compile_patterns([r"(unclosed"])


def test_captured_option_text_maps_to_its_letter():
    custom = compile_patterns([r"(?i)answer:\s*(.+)$"])
    assert extract_letter("Answer: square", OPTIONS, custom) == "B"


def test_nemo_gym_strict_boxed_mode():
    patterns, fallback = GRADING_MODES["strict_single_letter_boxed"]
    compiled = compile_patterns(patterns)
    assert extract_letter("Final: \\boxed{ [C] }", OPTIONS, compiled, fallback) == "C"
    assert extract_letter("Answer: C", OPTIONS, compiled, fallback) is None


def test_nemo_gym_lenient_boxed_matches_option_text():
    patterns, fallback = GRADING_MODES["lenient_boxed"]
    compiled = compile_patterns(patterns)
    assert extract_letter("\\boxed{Square}", OPTIONS, compiled, fallback) == "B"
    assert extract_letter("\\boxed{Pentagon}", OPTIONS, compiled, fallback) is None


def test_nemo_gym_lenient_answer_colon():
    patterns, fallback = GRADING_MODES["lenient_answer_colon"]
    compiled = compile_patterns(patterns)
    assert extract_letter("Answer: B", OPTIONS, compiled, fallback) == "B"
    assert extract_letter("Answer: Triangle", OPTIONS, compiled, fallback) == "C"


def test_ambiguous_option_text_gives_nothing():
    options = {"A": "same", "B": "same"}
    patterns, fallback = GRADING_MODES["lenient_boxed"]
    assert extract_letter("\\boxed{same}", options, compile_patterns(patterns), fallback) is None


@pytest.mark.parametrize("text", [" " * 100_000, "answer" + " " * 100_000 + "z", "answer is" + " " * 100_000,
                                  "\\boxed{" + " " * 100_000, "\\boxed{" + "(" * 100_000, "(" * 100_000,
                                  "*" * 100_000 + "x", "A" + " " * 100_000 + "x", "answer:" + "(" * 100_000],
                         ids=lambda t: repr(t[:8]))
@pytest.mark.timeout(60)
def test_default_and_nemo_patterns_are_linear(text):
    """Each pattern on 100k adversarial characters: linear takes milliseconds, quadratic would take minutes."""
    pick(text)
    for patterns, fallback in GRADING_MODES.values():
        extract_letter(text, OPTIONS, compile_patterns(patterns), fallback)
