"""reasoning_gym: row generation and scoring with the task's own score_answer (real package)."""
from __future__ import annotations

import json

import pytest

from services.resources.reasoning_gym.generate import generate_rows, task_names
from services.resources.reasoning_gym.scoring import extract_answer, score

TASKS = ["chain_sum", "spell_backward", "leg_counting", "letter_counting"]


@pytest.mark.parametrize("task", TASKS)
def test_rows_carry_the_entry_and_score_their_own_answer(task):
    rows = generate_rows(task, 3, seed=11)
    assert len(rows) == 3
    for row in rows:
        assert row["task_name"] == task
        assert row["agent_ref"] == {"type": "responses_api_agents", "name": "reasoning_gym_simple_agent"}
        entry = row["reasoning_gym_entry"]
        assert {"question", "answer", "metadata"} <= set(entry)
        assert row["responses_create_params"]["input"][-1]["content"] == entry["question"]
        assert json.loads(json.dumps(row)) == row  # JSONL-safe
        # the JSON round-tripped entry still scores: right answer 1.0, a wrong one less
        assert score(task, f"thinking...<answer>{entry['answer']}</answer>", entry) == (1.0, entry["answer"])
        assert score(task, "<answer>definitely not it</answer>", entry)[0] < 1.0


def test_same_seed_same_rows_other_seed_other_rows():
    assert generate_rows("chain_sum", 4, seed=5) == generate_rows("chain_sum", 4, seed=5)
    assert generate_rows("chain_sum", 4, seed=5) != generate_rows("chain_sum", 4, seed=6)


def test_agent_name_is_stamped():
    assert generate_rows("chain_sum", 1, 0, agent_name="rg_agent")[0]["agent_ref"]["name"] == "rg_agent"


def test_unknown_task_lists_valid_ones():
    with pytest.raises(ValueError) as info:
        generate_rows("no_such_task", 2, 0)
    assert "no_such_task" in str(info.value) and "chain_sum" in str(info.value)
    assert "chain_sum" in task_names() and len(task_names()) > 50


@pytest.mark.parametrize("size,seed", [(0, 1), (-3, 1), ("2", 1), (2, "x"), (True, 1)])
def test_bad_size_or_seed(size, seed):
    with pytest.raises(ValueError):
        generate_rows("chain_sum", size, seed)


@pytest.mark.parametrize("text,answer", [
    ("reasoning <answer> 42 </answer>", "42"),
    ("<answer>1</answer> then <answer>2</answer>", "2"),
    ("so \\boxed{17} it is", "17"),
    ("  just 9  ", "just 9"),
    ("<answer>7</answer> and \\boxed{8}", "7"),
])
def test_answer_extraction_order(text, answer):
    assert extract_answer(text) == answer


def test_full_text_mode_skips_tags():
    assert extract_answer(" <answer>1</answer> ", "full_text") == "<answer>1</answer>"


def test_json_lossy_entries_are_regenerated_for_the_scorer():
    """arc_agi compares against tuples that JSON turns into lists; the row's seed/size restore them."""
    row = generate_rows("arc_agi", 2, seed=3)[1]
    entry, source = row["reasoning_gym_entry"], row["reasoning_gym_dataset"]
    assert source == {"seed": 3, "size": 2}
    assert "reasoning_gym_dataset" not in generate_rows("chain_sum", 1, seed=3)[0]  # JSON-safe: not needed
    right = f"<answer>{entry['answer']}</answer>"
    assert score("arc_agi", right, entry, source=source)[0] == 1.0
    assert score("arc_agi", "<answer>1 2\n3 4</answer>", entry, source=source)[0] < 1.0


def test_mismatched_source_falls_back_to_the_row_entry():
    entry = generate_rows("chain_sum", 1, seed=1)[0]["reasoning_gym_entry"]
    wrong_source = {"seed": 999, "size": 1}  # regenerates another question: ignored
    assert score("chain_sum", f"<answer>{entry['answer']}</answer>", entry, source=wrong_source)[0] == 1.0
    assert score("chain_sum", f"<answer>{entry['answer']}</answer>", entry, source={"seed": "x"})[0] == 1.0


@pytest.mark.parametrize("text", ["<answer>a</answer>", "x <answer> 1 </answer> y <answer>2</answer>",
                                  "<answer>a<answer>b</answer>", "<answer>open", "</answer><answer>z</answer>",
                                  "<answer></answer>", "none", "<answer>\n multi\nline \n</answer>",
                                  "<answer>x</answer><answer>"])
def test_tag_extraction_matches_reasoning_gym(text):
    from reasoning_gym.utils import extract_answer as reference

    from services.resources.reasoning_gym.scoring import last_tagged
    assert last_tagged(text) == reference(text)


@pytest.mark.timeout(60)  # linear takes well under a second; quadratic would take minutes
def test_extraction_is_linear_on_adversarial_text():
    for text in ("<answer>" * 25_000, "\\boxed{" * 25_000, "\\boxed{" + "{" * 200_000):
        extract_answer(text)


def test_boxed_with_nested_braces():
    assert extract_answer("so \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"


# Reference answers the entry keeps in its metadata when `answer` is None (the scorer checks validity).
REFERENCE = {"graph_color": lambda e: json.dumps(e["metadata"]["possible_answer"]),
             "propositional_logic": lambda e: e["metadata"]["example_answer"],
             "rubiks_cube": lambda e: e["metadata"]["example_correct_answer"]}
# No correct answer in the entry at all: the scorer simulates the submitted plan (only a wrong one is checked).
NO_REFERENCE = {"boxnet", "rush_hour"}
# A wrong answer in the task's own format: reasoning-gym's prime_factorization scorer raises on free text.
WRONG = {"prime_factorization": "2 × 2", "game_of_life_halting": None}
# composite mixes other tasks and needs a list of them: it has no rows of its own to generate.
ALL_TASKS = [t for t in task_names() if t != "composite"]


@pytest.mark.parametrize("task", ALL_TASKS)
def test_every_task_scores_a_right_answer_one_and_a_wrong_one_less(task):
    row = generate_rows(task, 1, seed=3)[0]
    entry, source = row["reasoning_gym_entry"], row.get("reasoning_gym_dataset")
    if task not in NO_REFERENCE:
        right = REFERENCE[task](entry) if task in REFERENCE else entry["answer"]
        assert score(task, f"<answer>{right}</answer>", entry, source=source)[0] == 1.0
    wrong = WRONG.get(task, "definitely not it")
    if task == "game_of_life_halting":
        wrong = {"True": "False", "False": "True"}[entry["answer"]]
    assert score(task, f"<answer>{wrong}</answer>", entry, source=source)[0] < 1.0


def test_composite_is_not_a_task_of_its_own():
    assert "composite" in task_names() and len(ALL_TASKS) >= 100
    with pytest.raises((AssertionError, ValueError), match="at least one dataset"):
        generate_rows("composite", 1, seed=3)
