"""IFEval checks: each instruction type passing and failing, strict vs loose, row validation."""
from __future__ import annotations

import pytest

from services.resources.instruction_following.checks import (IFEVAL_IDS, REGISTRY, InstructionError, check_row,
                                                             count_sentences, count_words, loose_variants, parse_row)


def follows(iid: str, text: str, loose: bool = False, **kwargs) -> bool:
    return check_row(text, parse_row([iid], [kwargs]), loose)[0]


CASES = [
    # (id, kwargs, passing text, failing text)
    ("keywords:existence", {"keywords": ["routine", "dark"]}, "Keep a ROUTINE and a dark room.", "Keep a routine."),
    ("keywords:frequency", {"keyword": "sea", "frequency": 2, "relation": "at least"}, "Sea and sea.", "The sea."),
    ("keywords:frequency", {"keyword": "sea", "frequency": 2, "relation": "less than"}, "The sea.", "Sea, sea."),
    ("keywords:forbidden_words", {"forbidden_words": ["bad"]}, "A badge is fine.", "This is Bad."),
    ("keywords:letter_frequency", {"letter": "a", "let_frequency": 3, "let_relation": "at least"}, "banana", "bob"),
    ("keywords:letter_frequency", {"letter": "Z", "let_frequency": 1, "let_relation": "less than"}, "abc", "Zebra"),
    ("length_constraints:number_words", {"num_words": 3, "relation": "less than"}, "Two words", "One two three"),
    ("length_constraints:number_words", {"num_words": 3, "relation": "at least"}, "Don't stop now", "Hi there"),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "at least"},
     "It rains. We stay in.", "It rains and we stay in."),
    ("length_constraints:number_sentences", {"num_sentences": 2, "relation": "less than"},
     "Mr. Smith paid 3.5 dollars.", "One. Two. Three."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First.\n***\nSecond.", "First.\n***\n\n***\nX"),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     "First part.\n\n\"Then, the end.", "First part.\n\nAfter that."),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name] at [address]", "Dear [name]"),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\n\nP.S. See you", "Hi. PS see you"),
    ("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\np.p.s. more", "Hi.\nP.S. more"),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* one\n- two", "* one\n* two\n* three"),
    ("detectable_format:constrained_response", {}, "My answer is yes.", "Yes."),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and **two**", "*one* and * *"),
    ("detectable_format:multiple_sections", {"section_spliter": "Section", "num_sections": 2},
     "Section 1\nA\nSection 2\nB", "Section 1\nA"),
    ("detectable_format:json_format", {}, "```json\n{\"a\": 1}\n```", "{a: 1}"),
    ("detectable_format:title", {}, "<<My Poem>>\nroses", "<< >> no title"),
    ("combination:two_responses", {}, "Answer one.\n******\nAnswer two.", "Same.\n******\nSame."),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Say hi."}, "say hi. Hi!", "Hi! Say hi."),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Done. Any other questions?\"", "Any other questions? Bye"),
    ("startend:start_checker", {"starter": "I would say"}, "  I would say yes", "Well, I would say yes"),
    ("startend:quotation", {}, " \"quoted\" ", "\"half"),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
     "THIS is VERY well-known", "Only ONE here"),
    ("change_case:english_capital", {}, "THIS IS AN ENGLISH SENTENCE ABOUT THE WEATHER TODAY.",
     "This Is Not All Caps."),
    ("change_case:english_lowercase", {}, "this is an english sentence about the weather today.",
     "this is Not lowercase."),
    ("punctuation:no_comma", {}, "No commas here.", "One, two."),
    ("language:response_language", {"language": "de"}, "Das ist ein kurzer Satz auf Deutsch über das Wetter heute.",
     "This is a short sentence in English about the weather today."),
]


@pytest.mark.parametrize("iid,kwargs,good,bad", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_instruction_passes_and_fails(iid, kwargs, good, bad):
    assert follows(iid, good, **kwargs) is True
    assert follows(iid, bad, **kwargs) is False


def test_every_ifeval_type_is_covered_by_tests():
    tested = {c[0] for c in CASES}
    assert len(IFEVAL_IDS) == 26 and tested == IFEVAL_IDS and IFEVAL_IDS <= set(REGISTRY)


def test_counting_helpers():
    assert count_words("Don't stop-me now!") == 5  # \w+ tokens, as IFEval counts
    assert count_sentences("Hello world. This is Mr. Smith. He paid 3.5 dollars! Really? Yes") == 5
    assert count_sentences("") == 0


def test_loose_variants_strip_lines_and_asterisks():
    variants = loose_variants("Sure!\n**Body, here**\nThanks")
    assert "**Body, here**\nThanks" in variants and "Sure!\n**Body, here**" in variants
    assert "Body, here" in variants and len(variants) == 8


def test_loose_accepts_what_strict_rejects():
    text = "Here is my answer:\n\"the whole reply quoted\""
    assert follows("startend:quotation", text) is False
    assert follows("startend:quotation", text, loose=True) is True
    # asterisks removed: "*Title*" highlight would not matter, but a comma check stays strict
    assert follows("punctuation:no_comma", "Intro, hi\nbody", loose=True) is True
    assert follows("punctuation:no_comma", "a, b", loose=True) is False


def test_empty_response_follows_nothing():
    assert check_row("", parse_row(["punctuation:no_comma"], [{}]), False) == [False]
    assert check_row("   ", parse_row(["punctuation:no_comma"], [{}]), True) == [False]


def test_none_kwargs_are_dropped_like_ifeval():
    pairs = parse_row(["punctuation:no_comma", "detectable_format:title"], [{"num_words": None}, None])
    assert [iid for iid, _ in pairs] == ["punctuation:no_comma", "detectable_format:title"]


def test_keywords_are_literal_not_regex():
    assert follows("keywords:existence", "costs $5 (approx.)", keywords=["$5 (approx.)"]) is True
    assert follows("keywords:existence", "costs 5 dollars", keywords=["c.sts"]) is False


@pytest.mark.parametrize("ids,kwargs,message", [
    (["nope:unknown"], [{}], "unknown instruction id 'nope:unknown'"),
    ([], [], "non-empty list"),
    ("punctuation:no_comma", [{}], "non-empty list"),
    (["punctuation:no_comma"], [{}, {}], "one per entry"),
    (["punctuation:no_comma"], ["x"], "expected an object"),
    (["length_constraints:number_words"], [{"relation": "at least"}], "missing kwarg 'num_words'"),
    (["length_constraints:number_words"], [{"num_words": "ten", "relation": "at least"}], "must be an integer"),
    (["length_constraints:number_words"], [{"num_words": 5, "relation": "more than"}], "must be one of"),
    (["keywords:existence"], [{"keywords": [1, 2]}], "list of strings"),
    (["keywords:letter_frequency"], [{"letter": "ab", "let_frequency": 1, "let_relation": "at least"}], "single letter"),
])
def test_bad_rows_raise_naming_the_problem(ids, kwargs, message):
    with pytest.raises(InstructionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_row(ids, kwargs)


def test_multiple_instructions_give_per_instruction_results():
    pairs = parse_row(["punctuation:no_comma", "detectable_format:title", "startend:quotation"], [{}, {}, {}])
    assert check_row("<<T>> no commas", pairs, False) == [True, True, False]


ADVERSARIAL = [" " * 200_000, "\n" * 200_000, "." * 200_000, "[" * 200_000, "<<" * 100_000, "*" * 200_000,
               "mr. " * 50_000, "(" * 200_000, "p" + " " * 200_000, "A" + " " * 200_000 + "x"]


@pytest.mark.timeout(60)  # generous: linear is ~1 s on a loaded 2-core machine, quadratic takes many minutes
@pytest.mark.parametrize("text", ADVERSARIAL, ids=lambda t: repr(t[:6]))
def test_every_regex_check_is_linear_on_adversarial_text(text):
    """A quadratic check would take minutes on 200k characters; all of them together take well under a second."""
    slow = {"language:response_language", "change_case:english_capital", "change_case:english_lowercase"}
    ids = sorted(IFEVAL_IDS - slow)
    kwargs = {c[0]: c[1] for c in CASES}
    pairs = parse_row(ids, [kwargs[i] for i in ids])
    check_row(text, pairs, loose=True)


def test_linear_rewrites_agree_with_ifeval_regexes():
    import re
    from services.resources.instruction_following.checks import count_placeholders, has_title
    samples = ["[a] [b]\n[c", "[[x]] [", "no brackets", "[\n]", "[a][b][c]", "[ ] x ]", "<<a>> <<b>>",
               "<<>>", "<<<>>", "<< >>\n<<t>>", "x <<title>> y >> z", "<<a\n>>", "<<<>>>", "<<>>>"]
    for sample in samples:
        assert count_placeholders(sample) == len(re.findall(r"\[.*?\]", sample)), sample
        assert has_title(sample) == any(t.lstrip("<").rstrip(">").strip()
                                        for t in re.findall(r"<<[^\n]+>>", sample)), sample
