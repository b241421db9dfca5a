"""Worker-side scoring for reasoning-gym (runs in the core WorkerPool).

Building a task's dataset object (which `score_answer` hangs off) can be slow, so each
worker caches one scorer per task.
"""
from __future__ import annotations

import functools
import re
from typing import Any, Callable

# Nested one level (`\boxed{\frac{1}{2}}`), and linear: no quantifier can rescan text.
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})+)\}")
_OPEN, _CLOSE = "<answer>", "</answer>"


def warm_worker() -> None:
    """Import reasoning_gym once per worker, before the first request."""
    import reasoning_gym  # noqa: F401


@functools.lru_cache(maxsize=256)
def scorer(task: str) -> Callable[..., float]:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


@functools.lru_cache(maxsize=16)
def _dataset(task: str, seed: int, size: int) -> Any:
    import reasoning_gym

    return reasoning_gym.create_dataset(task, size=size, seed=seed)


def original_entry(task: str, entry: dict[str, Any], source: dict[str, Any] | None) -> tuple[dict[str, Any], Any]:
    """(entry, dataset): the generator's own entry object when the row says how it was made.

    JSON turns tuples into lists; scorers comparing against tuples (arc_agi, rearc) then
    fail a right answer. Regenerating (deterministic per seed and index) restores them;
    the question must match, else the row's entry is used as is.
    """
    if not isinstance(source, dict):
        return entry, None
    seed, size, index = source.get("seed"), source.get("size"), entry.get("metadata", {}).get("source_index")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (seed, size, index)) or not 0 <= index < size:
        return entry, None
    dataset = _dataset(task, seed, size)
    regenerated = dataset[index]
    if regenerated.get("question") != entry.get("question"):
        return entry, None
    return regenerated, dataset


def last_tagged(text: str) -> str | None:
    """reasoning_gym.utils.extract_answer's result (the last lazy `<answer>(.*?)</answer>` match,
    stripped) in linear time: its regex rescans to the end from every unclosed `<answer>`."""
    found, pos = None, 0
    while (start := text.find(_OPEN, pos)) != -1:
        end = text.find(_CLOSE, start + len(_OPEN))
        if end == -1:
            break
        found, pos = text[start + len(_OPEN):end], end + len(_CLOSE)
    return None if found is None else found.strip()


def extract_answer(text: str, mode: str = "tags_then_boxed") -> str:
    """The model's answer: `<answer>...</answer>`, else `\\boxed{...}`, else the whole text (NeMo-Gym's order)."""
    if mode == "full_text":
        return text.strip()
    found = last_tagged(text)
    if found is not None:
        return found
    boxed = _BOXED.search(text)
    if boxed:
        return boxed.group(1).strip()
    return text.strip()


def score(task: str, text: str, entry: dict[str, Any], mode: str = "tags_then_boxed",
          source: dict[str, Any] | None = None) -> tuple[float, str]:
    """(the task's own score of the extracted answer, the extracted answer)."""
    answer = extract_answer(text, mode)
    if task in _OWN_SCORERS:
        return _OWN_SCORERS[task](answer, entry), answer
    entry, dataset = original_entry(task, entry, source)
    score_answer = dataset.score_answer if dataset is not None else scorer(task)
    return float(score_answer(answer, entry)), answer


def _same_boolean(answer: str, entry: dict[str, Any]) -> float:
    return 1.0 if answer.strip().lower() == str(entry.get("answer")).strip().lower() else 0.0


# Tasks whose reasoning-gym scorer rewards wrong answers: game_of_life_halting compares
# bool(answer) == bool(entry["answer"]), so any non-empty text ("False", "no idea") scores 1.0.
_OWN_SCORERS: dict[str, Callable[[str, dict[str, Any]], float]] = {"game_of_life_halting": _same_boolean}
