"""Realistic response mixes per environment, for the tail and batch-completion benchmarks.

Rows are the project's example datasets (`datasets/<env>/example.jsonl`); each row gets
responses shaped like a policy's during training, in rough training proportions: correct
answers in the forms models write them (boxed, fractions, decimals, radicals, plain text),
wrong answers, answers missing, and long reasoning (several kB). Code gets correct, wrong and
broken programs; instruction_following gets compliant and non-compliant texts. A seeded
draw, so two runs (and the two sides of an A/B) see the same items.

When NeMo-Gym 0.7.0's virtualenv is cached (the compat tests create it), its recorded rollouts
(real model responses to its example rows: math_with_judge, code_gen, instruction_following)
join the mix as one item in ten, each with its own NeMo-Gym row, unchanged.
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ENVS = ("math", "code", "instruction_following")
NEMO_GYM_ENVS = {"math": "math_with_judge", "code": "code_gen", "instruction_following": "instruction_following"}
RECORDED_SHARE = 0.1

REASONING = ("Let me restate the problem to be sure I read it right. ",
             "We can check this by substituting back into the original expression. ",
             "Hmm, wait. Let me double check the arithmetic before going on. ",
             "Consider the small cases first and look for a pattern. ",
             "Simplifying both sides step by step gives the same value. ")

# per math row (by expected answer): equivalent forms a model writes, and plausible wrong ones
MATH_FORMS = {"42": (["42", "42.0", "\\boxed{42}"], ["41", "52"]),
              "\\frac{1}{2}": (["\\frac{1}{2}", "0.5", "1/2", "\\dfrac{2}{4}"], ["\\frac{1}{4}", "2"]),
              "6": (["6", "x = 6", "x=6.0"], ["-6", "13"]),
              "5\\sqrt{2}": (["5\\sqrt{2}", "\\sqrt{50}"], ["25", "7.07", "\\sqrt{5}"]),
              "36": (["36", "36 \\text{ square units}"], ["26", "13"]),
              "x^2+2x+1": (["x^2+2x+1", "(x+1)^2", "1 + 2x + x^2"], ["x^2+1", "x^2+x+1"]),
              "1024": (["1024", "2^{10}"], ["512", "2048"])}

CODE = {
    "sum_two": ("a, b = map(int, input().split())\nprint(a + b)", "a, b = input().split()\nprint(a + b)"),
    "reverse_words": ("print(' '.join(input().split()[::-1]))", "print(input()[::-1])"),
    "count_primes": ("n = int(input())\nsieve = [True] * (n + 1)\nsieve[:2] = [False, False][:n + 1]\n"
                     "for i in range(2, int(n ** 0.5) + 1):\n    if sieve[i]:\n"
                     "        sieve[i * i::i] = [False] * len(sieve[i * i::i])\nprint(sum(sieve))",
                     "n = int(input())\nprint(sum(1 for k in range(2, n) if all(k % d for d in range(2, k))))"),
    "fizzbuzz": ("n = int(input())\nfor i in range(1, n + 1):\n"
                 "    print('FizzBuzz' if i % 15 == 0 else 'Fizz' if i % 3 == 0 else 'Buzz' if i % 5 == 0 else i)",
                 "n = int(input())\nfor i in range(n):\n    print('Fizz' if i % 3 == 0 else i)"),
    "is_palindrome": ("def is_palindrome(s: str) -> bool:\n    t = [c.lower() for c in s if c.isalnum()]\n"
                      "    return t == t[::-1]", "def is_palindrome(s: str) -> bool:\n    return s == s[::-1]"),
    "gcd": ("def gcd(a: int, b: int) -> int:\n    while b:\n        a, b = b, a % b\n    return a",
            "def gcd(a: int, b: int) -> int:\n    return min(a, b)"),
    "running_max": ("def running_max(xs: list[int]) -> list[int]:\n    out, best = [], None\n    for x in xs:\n"
                    "        best = x if best is None else max(best, x)\n        out.append(best)\n    return out",
                    "def running_max(xs):\n    return sorted(xs)"),
}

INSTRUCTION = [  # (compliant, non-compliant) per example row, in file order
    ("<<The Sea>>\nWaves roll in and out\nthe tide keeps time\nsalt on the wind",
     "The Sea\nWaves roll in, and out, the tide keeps time."),
    ("fresh pasta with basil and tomato is my favourite. it tastes of summer and home.",
     "Fresh Pasta with Basil is my FAVOURITE food because it reminds me of summer."),
    ("* Keep a regular routine\n* Sleep in a dark room\n* Avoid screens late",
     "Keep a routine and sleep well. Avoid coffee."),
    ('"A compiler translates source code into machine code before the program runs. Any other questions?"',
     "A compiler turns code into programs."),
    ("Dear Sam,\n*first news* is good and *second news* is better.\nSee you soon.\nP.S. bring the map",
     "Dear Sam, all is well here. See you soon."),
    ('{"name": "Ada Marsh", "age": 34}', "Her name is Ada Marsh and she is 34."),
    ("Autumn arrives with amber leaves. Apples and acorns fall across the paths. "
     "Afternoons are darker and calmer.", "Leaves fall."),
]


def rows(env: str) -> list[dict[str, Any]]:
    path = ROOT / "datasets" / env / "example.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def nemo_gym_recorded(env: str) -> list[tuple[dict[str, Any], str]]:
    """NeMo-Gym's recorded (row, response text) pairs for `env`; empty when its virtualenv is not cached."""
    cache = Path(os.environ.get("GYMSERVE_NEMO_GYM_CACHE") or Path.home() / ".cache" / "gymserve")
    found = sorted(cache.glob(f"nemo-gym-0.7.0/lib/python3.*/site-packages/resources_servers/{NEMO_GYM_ENVS[env]}/data"))
    if not found:
        return []
    read = lambda name: [json.loads(line) for line in (found[0] / name).read_text().splitlines() if line.strip()]  # noqa: E731
    prompt = lambda record: str(record["responses_create_params"]["input"][0]["content"])  # noqa: E731
    by_prompt = {prompt(row): row for row in read("example.jsonl")}
    out = []
    for rollout in read("example_rollouts.jsonl"):
        row = by_prompt.get(prompt(rollout))
        message = [item for item in rollout["response"]["output"] if item.get("type") == "message"]
        if row is None or not message:
            continue
        text = "".join(part.get("text", "") for part in message[-1]["content"])
        out.append(({**row, "agent_ref": {"name": f"{env}_simple_agent"}}, text))
    return out


def _long(rng: random.Random, answer: str) -> str:
    """A long reasoning trace (4 to 12 kB) ending in the answer."""
    body = "".join(rng.choice(REASONING) for _ in range(rng.randint(60, 180)))
    return f"{body}\nTherefore the final answer is $\\boxed{{{answer}}}$."


def math_response(row: dict[str, Any], rng: random.Random) -> str:
    right, wrong = MATH_FORMS.get(row["expected_answer"], ([row["expected_answer"]], ["0"]))
    steps = "".join(rng.choice(REASONING) for _ in range(rng.randint(1, 6)))
    roll = rng.random()
    if roll < 0.45:
        return f"{steps}So the answer is $\\boxed{{{rng.choice(right)}}}$."
    if roll < 0.55:
        return f"{steps}The answer is {rng.choice(right)}."  # no box: the checker falls back to the last number
    if roll < 0.85:
        return f"{steps}So the answer is $\\boxed{{{rng.choice(wrong)}}}$."
    if roll < 0.90:
        return f"{steps}I could not finish this one."
    return _long(rng, rng.choice(right + wrong))


def code_response(row: dict[str, Any], rng: random.Random) -> str:
    good, bad = CODE[row["id"]]
    roll = rng.random()
    program = good if roll < 0.5 else bad if roll < 0.85 else good.replace("(", "((", 1)  # last: a syntax error
    return f"Here is a solution.\n\n```python\n{program}\n```"


def instruction_response(index: int, rng: random.Random) -> str:
    good, bad = INSTRUCTION[index % len(INSTRUCTION)]
    return good if rng.random() < 0.6 else bad


def mix(env: str, n: int, seed: int = 0) -> list[tuple[dict[str, Any], str]]:
    """`n` (row, response text) pairs for `env`, or for a blend of all three when env is `blend`."""
    rng = random.Random(seed)
    if env == "blend":  # math-heavy, as training mixes usually are
        weights = {"math": 0.5, "code": 0.25, "instruction_following": 0.25}
        parts = [mix(name, round(n * w), seed + k) for k, (name, w) in enumerate(weights.items())]
        items = [item for part in parts for item in part]
        rng.shuffle(items)
        return items[:n]
    table, recorded = rows(env), nemo_gym_recorded(env)
    out = []
    for _ in range(n):
        if recorded and rng.random() < RECORDED_SHARE:
            out.append(rng.choice(recorded))
            continue
        index = rng.randrange(len(table))
        row = table[index]
        if env == "math":
            text = math_response(row, rng)
        elif env == "code":
            text = code_response(row, rng)
        else:
            text = instruction_response(index, rng)
        out.append((row, text))
    return out
