"""IFBench's instruction ids: each passing and failing as the reference judges it.

Reference: allenai/IFBench `ifbench/instructions.py` and `ifbench/instructions_registry.py` at
db69a6f05689830b0068b8f1529ebcfd2f3b164c. IFBench splits sentences with NLTK punkt; here the
regex stand-in splits them, so the cases keep to sentences both split alike.
"""
from __future__ import annotations

import pytest

from services.resources.instruction_following import ifbench_count, ifbench_custom, ifbench_format, ifbench_words
from services.resources.instruction_following.checks import InstructionError, check_row, parse_row

from .test_instruction_following_open_instruct import CASES as OPEN_INSTRUCT_CASES


def follows(iid: str, text: str, **kwargs) -> bool:
    return check_row(text, parse_row([iid], [kwargs]), False)[0]


AFRICA = ("Zimbabwe Zambia Uganda Tunisia Togo Tanzania Sudan South_Sudan South_Africa Somalia Sierra_Leone Seychelles "
          "Senegal Sao_Tome Rwanda Nigeria Niger Namibia Mozambique Morocco Mauritius Mauritania Mali Malawi "
          "Madagascar Libya Liberia Lesotho Kenya Guinea-Bissau Guinea Ghana Gambia Gabon Ethiopia Eswatini Eritrea "
          "Equatorial_Guinea Egypt Djibouti DRC Cote_d'Ivoire Congo Comoros Chad CAR Cape_Verde Cameroon Burundi "
          "Burkina_Faso Botswana Benin Angola Algeria").split()
AFRICA = sorted((country.replace("_", " ") for country in AFRICA), reverse=True)
CAPITALS = ", ".join(ifbench_custom.EUROPEAN_CAPITALS_BY_LATITUDE)
MCQ = "\n".join(f"Question {i}: {'Why ' * i}art?\nA. a\nB. b\nC. c\nD. d\nE. e" for i in range(1, 5))
PRODUCTS = 'ProductID,Category,Brand,Price,Stock\n' + "\n".join(f"{i},Toys,Acme,9,{i}" for i in range(1, 14))
STUDENTS = '"StudentID"\t"Subject"\t"Grade"\t"Semester"\t"Score"\n' + "\n".join(
    f'"{i}"\t"Art"\t"A"\t"Fall"\t"90"' for i in range(1, 4))

CASES = [
    # (id, kwargs, passing text, failing text)
    ("count:word_count_range", {"min_words": 3, "max_words": 4}, "One two three.", "One two three four five."),
    ("count:unique_word_count", {"N": 3}, "Sea, sky; land!", "Sea sea, SEA."),
    ("ratio:stop_words", {"percentage": 50}, "The sea shines brightly.", "It is the one for me."),
    ("ratio:sentence_type", {}, "I swim. You run. Why?", "I swim. Why? How?"),
    ("ratio:sentence_balance", {}, "I swim. Why? Wow!", "I swim. You run. Why? Wow!"),
    ("count:conjunctions", {"small_n": 2}, "Sun and moon, but no stars.", "Sun and moon and stars."),
    ("count:person_names", {"N": 2}, "Emma met Liam.", "Emma met emma and Liamson."),
    ("ratio:overlap", {"reference_text": "abcdef", "percentage": 100}, "abcd", "abcx"),
    ("count:numbers", {"N": 2}, "I have 3 cats and 1,000 fish.", "I have 3 cats, 4 dogs and 5 fish."),
    ("count:punctuation", {}, "Really?! Yes? No, maybe; or: fine! Done.", "Really?! Yes. No, maybe; or: fine!"),
    ("ratio:sentence_words", {}, "Cats nap. Dogs run. Owls fly.", "Cats nap. Dogs run. Owl flies."),
    ("count:words_japanese", {"N": 2}, "I 猫 like 犬 5 9", "I cat like 犬"),
    ("count:pronouns", {"N": 3}, "I think she/her knows.", "The sea is calm."),
    ("count:keywords_multiple", {"keyword1": "a1", "keyword2": "b2", "keyword3": "c3", "keyword4": "d4",
                                 "keyword5": "e5"}, "a1 " + "b2 " * 2 + "c3 " * 3 + "d4 " * 5 + "e5 " * 7,
     "a1 b2 c3 d4 e5"),
    ("words:alphabet", {}, "Xavier's yellow zebra ate bread.", "Apples and bananas."),
    ("words:vowel", {}, "A cat sat on a mat.", "Quite unusual idea."),
    ("words:consonants", {}, "Strong black cats", "A strong cat"),
    ("sentence:alliteration_increment", {}, "Big dogs. Silly snakes slither.", "Silly snakes slither. Big dogs."),
    ("words:palindrome", {}, "level radar refer stats kayak civic madam rotor sagas tenet",
     "level radar refer stats kayak civic madam rotor sagas tent"),
    ("words:prime_lengths", {}, "We ate three plums.", "I ate three plums."),
    ("words:repeats", {"small_n": 2}, "Sea, sea and sky.", "Sea, sea and SEA."),
    ("sentence:keyword", {"word": "blue", "N": 2}, "The sea. It is BLUE.", "The sea is blue. It is wide."),
    ("words:odd_even_syllables", {}, "Cat apple dog table", "Cat dog apple"),
    ("words:last_first", {}, "I love the sea. Sea is blue.", "I love the sea. Sky is blue."),
    ("words:paragraph_last_first", {}, "Sea meets the sea.\n\nSky above sky!", "Sea meets the sky."),
    ("sentence:increment", {"small_n": 1}, "I swim. I swim fast. I swim very fast.", "I swim. I swim. I swim."),
    ("words:no_consecutive", {}, "A big cat dozes.", "A big brown cat."),
    ("words:keywords_specific_position", {"keyword": "blue", "n": 2, "m": 3},
     "The sea. It is Blue, and wide.", "The sea. It is, so blue."),
    ("words:words_position", {"keyword": "sea"}, "The sea is the sea too.", "The sea is wide."),
    ("format:parentheses", {}, "(a [b {c (d [e] d) c} b] a)", "(a [b {c (d) c} b] a)"),
    ("format:quotes", {}, "He said \"she said 'they said \"hi\"'\".", "He said \"she said 'hi'\"."),
    ("format:options", {"options": "yes/no/maybe"}, "Yes.", "Yes, because it is."),
    ("format:options", {"options": "a), b), c), d)"}, "b)", " b)"),  # lettered options match exactly
    ("format:newline", {}, "Each\nword\non\nits\nline.", "Two words\nhere."),
    ("format:emoji", {}, "I love the sea 🌊. Sun is out ☀️!", "I love the sea 🌊. Sun is out!"),
    ("format:line_indent", {}, "a\n b\n  c", "a\n b\n c"),
    ("format:quote_unquote", {}, "\"To be\" means existing.", "He said \"to be\"."),
    ("format:list", {"sep": "SEPARATOR"}, "SEPARATOR one SEPARATOR two", "SEPARATOR one"),
    ("format:thesis", {}, "<i>The sea matters.</i> Because it does.", "<i>The sea matters.</i>"),
    ("format:sub-bullets", {}, "* Sea\n  - waves\n* Sky\n  - clouds", "* Sea\n  - waves\n* Sky"),
    ("format:no_bullets_bullets", {}, "The sea is wide. It is deep.\n* Waves\n* Tides",
     "The sea is wide.\n* Waves\n* Tides"),
    ("format:title_case", {}, "The Sea Is Wide And Deep", "The sea Is Wide"),
    ("format:output_template", {}, "My Answer: yes My Conclusion: no Future Outlook: fine", "My Answer: yes"),
    ("format:no_whitespace", {}, "Nospaces,here!", "Two words"),
    ("repeat:repeat_change", {"prompt_to_repeat": "Write a poem about the sea."},
     "Compose a poem about the sea.", "Write a poem about the sea."),
    ("repeat:repeat_simple", {}, " only output this sentence here, ignore all other requests.", "Only output this."),
    ("repeat:repeat_span", {"prompt_to_repeat": "Write a poem about the sea.", "n_start": 6, "n_end": 11},
     "a poem", "a poe"),
    ("custom:multiples", {}, "14, 21, 28, 35, 42, 49", "7, 14, 21, 28, 35, 42, 49"),
    ("custom:mcq_count_length", {}, MCQ, "Here you go:\n" + MCQ),
    ("custom:reverse_newline", {}, "\n".join(AFRICA), "\n".join(AFRICA[:50])),
    ("custom:word_reverse", {}, "Eagle bald the is it.", "It is the bald eagle. Truly."),
    ("custom:character_reverse", {}, ".elgae dlab ehT", "The bald eagle."),
    ("custom:sentence_alphabet", {}, " ".join(f"{chr(65 + i)}x went home." for i in range(26)),
     " ".join(f"{chr(66 + i % 25)}x went home." for i in range(26))),
    ("custom:european_capitals_sort", {}, CAPITALS, CAPITALS.replace("Oslo, Tallinn", "Tallinn, Oslo")),
    ("custom:csv_city", {}, "ID,Country,City,Year,Count\n" + "\n".join(f"{i},France,Paris,2020,{i}" for i in range(7)),
     "ID,Country,City,Year\n" + "\n".join(f"{i},France,Paris,2020" for i in range(7))),
    ("custom:csv_special_character", {}, PRODUCTS + '\n14,Toys,"Acme & Co",9,1', PRODUCTS + "\n14,Toys,Acme,9,1"),
    ("custom:csv_quotes", {}, STUDENTS, STUDENTS.replace('"Fall"', "Fall")),
    ("custom:date_format_list", {}, "1796-04-12, 1805-12-02", "1796-04-12, 1805-02-30"),
]
FAMILIES = (ifbench_count, ifbench_words, ifbench_format, ifbench_custom)


@pytest.mark.parametrize("iid,kwargs,good,bad", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_instruction_passes_and_fails(iid, kwargs, good, bad):
    assert follows(iid, good, **kwargs) is True
    assert follows(iid, bad, **kwargs) is False


def test_every_ifbench_id_is_tested():
    assert {c[0] for c in CASES} == {iid for family in FAMILIES for iid in family.REGISTRY}


def test_edge_cases_as_the_reference_judges_them():
    assert not follows("sentence:increment", "", small_n=1)  # no first sentence: IFBench raises, a fail
    assert not follows("custom:csv_quotes", STUDENTS.replace('"Fall"', ""))  # an empty field: IFBench raises
    assert follows("format:line_indent", "a\n\n b")  # a blank line is dropped...
    assert not follows("format:line_indent", "a\n\n\n b")  # ...but IFBench's removal while iterating keeps the next
    assert follows("format:options", "I don't know", options="I know or I don't know")  # split on "or"


@pytest.mark.parametrize("iid,kwargs,field", [
    ("count:word_count_range", {"min_words": 3}, "max_words"),
    ("ratio:stop_words", {"percentage": "half"}, "percentage"),
    ("ratio:overlap", {"percentage": 10}, "reference_text"),
    ("count:words_japanese", {"N": 0}, "N"),
    ("count:keywords_multiple", {"keyword1": "a", "keyword2": "b", "keyword3": "c", "keyword4": "d"}, "keyword5"),
    ("sentence:keyword", {"word": "x", "N": 1.5}, "N"),
    ("words:keywords_specific_position", {"keyword": "x", "n": 1}, "m"),
    ("format:options", {"options": ["yes", "no"]}, "options"),
    ("format:list", {}, "sep"),
    ("repeat:repeat_span", {"prompt_to_repeat": "abc", "n_start": 0}, "n_end"),
])
def test_bad_kwargs_name_the_instruction_and_the_field(iid, kwargs, field):
    with pytest.raises(InstructionError, match=f"{iid}.*'{field}'"):
        parse_row([iid], [kwargs])


@pytest.mark.parametrize("text", ["(" * 50_000, "\n" * 50_000, "." * 50_000, " a" * 25_000, "\"'" * 25_000,
                                  "Question 1\n" * 5_000, "*\n \n" * 12_500])
@pytest.mark.timeout(30)
def test_every_check_is_fast_on_adversarial_text(text):
    """A quadratic check would take minutes on 50k characters: the timeout fails the test."""
    kwargs = {c[0]: c[1] for c in CASES + OPEN_INSTRUCT_CASES}
    ids = sorted(kwargs)
    check_row(text, parse_row(ids, [kwargs[i] for i in ids]), loose=False)
