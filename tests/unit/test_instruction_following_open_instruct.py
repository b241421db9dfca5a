"""open-instruct's instruction ids (beyond IFEval's): each passing and failing as the reference judges it.

Reference: abukharin-nv/verifiable-instructions `verifiable_instructions/instructions.py` at
f46a5ac87b1400a4f8973039844b6be9b56e3faf (what NeMo-Gym 0.7.0's instruction_following server
imports), the same checks as allenai/open-instruct `open_instruct/IFEvalG/instructions.py` at
ebca9f7d4921042d7d8a65369e513d6566f0f3ba. The ids the references register are listed in
`instruction_following_reference_ids.json` beside this file.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.resources.instruction_following import open_instruct
from services.resources.instruction_following.checks import REGISTRY, UNSUPPORTED, InstructionError, check_row, parse_row

REFERENCE_IDS = Path(__file__).with_name("instruction_following_reference_ids.json")
REFERENCE_VERDICTS = Path(__file__).with_name("instruction_following_reference_verdicts.json")
PROMPT = "Write a poem about the sea."


def follows(iid: str, text: str, **kwargs) -> bool:
    return check_row(text, parse_row([iid], [kwargs]), False)[0]


CASES = [
    # (id, kwargs, passing text, failing text)
    ("copy:repeat_phrase", {"phrase": "The early bird catches the worm", "small_n": 2},
     "The late bird catches the worm and The early cat catches the worm", "The early bird catches the worm twice"),
    ("copy:repeat_phrase", {"phrase": "Time flies when having fun", "small_n": 2},  # only the last copy's change counts
     "Time flies when having fun. Time goes when having fun", "Time goes when having fun. Time flies when having fun"),
    ("copy:copy", {"prompt_to_repeat": PROMPT}, "  write a POEM about the sea. ", "Write a poem about the sea. Waves."),
    ("new:copy_span_idx", {"prompt_to_repeat": PROMPT, "n_start": 6, "n_end": 12}, "A Poem", "a poem about"),
    ("detectable_format:sentence_hyphens", {}, "I came.-I saw.-I won.", "I came. - I saw."),
    ("keywords:no_adjacent_consecutive", {}, "the sea is calm", "a big ship"),
    ("detectable_format:square_brackets", {}, "[every] [word] [here]", "[every] word"),
    ("keywords:word_once", {"keyword": "sea"}, "The sea is calm.", "Sea and sea."),
    ("keywords:word_count_different_numbers", {"keyword": "wave", "frequency": 2, "relation": "at least"},
     "Wave after wave.", "One wave."),
    ("keywords:exclude_word_harder", {"keyword": "sea"}, "Sea. The seas are blue, sea.", "The sea is blue."),
    ("paragraphs:paragraphs", {}, "*** First part.\n***\nSecond part. ***", "One.\n***\n\n***\nTwo."),
    ("paragraphs:paragraphs2", {}, "First.\n\nSecond.", "First.\n\n\n\nSecond."),
    ("first_word:first_word_sent", {"first_word": "crash"}, "Crash here. crash there! CRASH now? ", "Crash. CRASH?"),
    ("first_word:first_word_answer", {"first_word": "Hello"}, "hello there. Bye.", "Well, hello."),
    ("last_word:last_word_sent", {"last_word": "sea"}, "I love the sea. Look at the SEA!", "The sea. The sky."),
    ("last_word:last_word_answer", {"last_word": "Contest"}, "We won the contest!", "The contest we won."),
    ("detectable_format:bigram_wrapping", {}, "<<I am>> <<at home>> alone", "<<I am>> at <<home>>"),
    ("copy:copying_simple", {"prompt_to_repeat": PROMPT}, "Write a poem about the sea.", "Write a poem."),
    ("copy:copying_multiple", {"prompt_to_repeat": PROMPT, "N": 2},
     "Write a poem about the sea.\n******\nwrite a poem about the sea.", "Write a poem about the sea."),
    ("punctuation:punctuation_dot", {}, "No dots here!", "A dot."),
    ("punctuation:punctuation_exclamation", {}, "No marks.", "Wow!"),
    ("count:lowercase_counting", {"N": 3}, "ALL CAPS and lower words", "one two three four"),
    ("letters:letter_counting", {"N": 5, "relation": "less than"}, "abcd 123", "abcde"),
    ("letters:letter_counting", {"N": 5, "relation": "at least"}, "abcde", "ab 12 !"),
    ("letters:letter_counting2", {"letter": "a", "let_frequency": 2, "let_relation": "at least"}, "banana", "bob"),
    ("count:counting_composition", {"n_sent": 2, "n_words": 4},  # the final "." is a word for word_tokenize
     "Seas are wide. Waves roll in.\n***\nSkies look grey. Birds fly low.\n***\nShips sail on. Men wave back.",
     "Seas are wide. Waves roll in.\n***\nSkies look grey.\n***\nShips sail on. Men wave back."),
    ("count:count_unique", {}, "Every word, The end.", "The sea, the sea."),
    ("count:count_increment_word", {"keyword1": "sun", "keyword2": "moon"}, "Sun, moon and MOON.", "Sun and moon."),
    ("keywords:palindrome", {}, "We saw a racecar.", "No such words here"),
    ("keywords:keyword_specific_position", {"keyword": "blue", "n": 2, "m": 3},
     "The sea. It is blue and wide.", "The sea. It is Blue and wide."),
    ("keywords:start_end", {}, "Sea waves meet the sea", "Sea waves meet the sea."),
]


@pytest.mark.parametrize("iid,kwargs,good,bad", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_instruction_passes_and_fails(iid, kwargs, good, bad):
    assert follows(iid, good, **kwargs) is True
    assert follows(iid, bad, **kwargs) is False


def test_every_open_instruct_id_is_tested():
    assert {c[0] for c in CASES} == set(open_instruct.REGISTRY) | {"letters:letter_counting2"}


def test_the_registry_covers_every_reference_id():
    """Every id of verifiable-instructions, open-instruct's IFEvalG and IFBench is checked here or
    rejected with its reason; the reference lists are the checked-in file's, with their commits."""
    sources = json.loads(REFERENCE_IDS.read_text())["sources"]
    assert [len(s["ids"]) for s in sources] == [54, 54, 83] and all(len(s["commit"]) == 40 for s in sources)
    reference = {iid for source in sources for iid in source["ids"]}
    assert reference - set(REGISTRY) == set(UNSUPPORTED) == {"words:start_verb"}
    assert set(REGISTRY) - reference == {"startend:start_checker"}  # Google IFEval's, which the others dropped


def test_verdicts_equal_the_reference_codes_recorded_ones():
    """1,385 texts (both verdicts for every IFEval id but start_checker, every open-instruct and every
    IFBench id), judged by the reference code itself when the file was recorded (its header says how)."""
    rows = json.loads(REFERENCE_VERDICTS.read_text())["rows"]
    assert len(rows) == 1385 and len({r["id"] for r in rows}) == 25 + 29 + 57
    differ = [(r["id"], r["text"]) for r in rows if follows(r["id"], r["text"], **r["kwargs"]) is not r["followed"]]
    assert not differ


def test_edge_cases_as_the_reference_judges_them():
    assert not follows("last_word:last_word_answer", "", last_word="x")  # no last word
    assert follows("last_word:last_word_answer", "the end: (x).", last_word="x")  # punctuation stripped
    assert not follows("first_word:first_word_sent", "", first_word="x")  # an empty response follows nothing
    assert follows("last_word:last_word_sent", "I go. Let go!", last_word=["go", "stop"])  # a list: its first word
    assert not follows("paragraphs:paragraphs", "One paragraph only.")
    assert follows("keywords:word_once", "seashore", keyword="sea")  # a substring counts, as with re.findall
    assert follows("keywords:word_once", "a (b) c", keyword="(b)")  # matched literally, never as a regex
    assert not follows("copy:repeat_phrase", "The early bird catches the worm", phrase="The early bird catches the "
                       "worm", small_n=1)  # a copy must change exactly one word
    # three paragraphs but an empty one at the end: it has no sentences, so the composition fails
    text = "A b c. D e f.\n***\nA b c. D e f.\n***\nA b c. D e f.\n***"
    assert not follows("count:counting_composition", text, n_sent=2, n_words=4)


@pytest.mark.parametrize("iid,kwargs,field", [
    ("copy:repeat_phrase", {"phrase": "a b c"}, "small_n"),
    ("copy:copying_multiple", {"prompt_to_repeat": "x", "N": "two"}, "N"),
    ("new:copy_span_idx", {"prompt_to_repeat": "abc", "n_start": -1, "n_end": 2}, "n_start"),
    ("keywords:word_count_different_numbers", {"keyword": "a", "frequency": 1, "relation": "exactly"}, "relation"),
    ("count:count_increment_word", {"keyword1": "a"}, "keyword2"),
    ("keywords:keyword_specific_position", {"keyword": "a", "n": 0, "m": 1}, "n"),
    ("count:counting_composition", {"n_sent": 2, "n_words": True}, "n_words"),
    ("first_word:first_word_sent", {"first_word": ["go"]}, "first_word"),  # the reference fails on a list
    ("keywords:exclude_word_harder", {"keyword": ""}, "keyword"),
])
def test_bad_kwargs_name_the_instruction_and_the_field(iid, kwargs, field):
    with pytest.raises(InstructionError, match=f"{iid}.*'{field}'"):
        parse_row([iid], [kwargs])


def test_unsupported_and_unknown_ids_are_rejected_by_name():
    with pytest.raises(InstructionError, match="words:start_verb.*not supported.*tagger"):
        parse_row(["words:start_verb"], [{}])
    with pytest.raises(InstructionError, match="unknown instruction id 'count:no_such_check'"):
        parse_row(["count:no_such_check"], [{}])
