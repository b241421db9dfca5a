"""The "Proven" table of docs/nemo-gym-compat.md, one row per claim, each naming the tests that prove it.

A count in a row (`{count}`) is the number of cases its differential test compares: the test asserts
it through `compared(...)`, so the page cannot claim more (or less) than the suite checks.
`render()` is the Markdown the page carries between its markers; `test_compat_page.py` compares them
(`GYMSERVE_WRITE_COMPAT=1` rewrites the page)."""
from __future__ import annotations

from pathlib import Path

from tests.generated_docs import table_between, write_between

PAGE = Path(__file__).resolve().parents[2] / "docs" / "nemo-gym-compat.md"
START, END = "<!-- compat-proven:start -->", "<!-- compat-proven:end -->"

# cases compared per differential test (asserted by the tests)
COUNTS = {"mcqa": 290, "reasoning_gym": 280, "workplace_assistant": 110, "workplace_assistant_tools": 52,
          "instruction_following": 13, "equivalence_llm_judge": 3724}

# (what, NeMo-Gym 0.7.0 side, tests, count key or None)
ROWS: list[tuple[str, str, str, str | None]] = [
    ('collecting rollouts from a gymserve head',
     '`ng_collect_rollouts "+head_server={host:127.0.0.1,port:P}" +agent_name=math_simple_agent` on rows '
     'without `agent_ref`, 2 repeats: every rollout comes back with the right reward, no failures, and its'
     ' aggregate metrics file holds `mean/reward` and per-task rewards',
     '`tests/compat/test_nemo_gym_clients.py`', None),
    ('our collector on NeMo-Gym rows',
     '`gymserve collect --agent math_simple_agent` sends rows without `agent_ref` to that agent '
     "(NeMo-Gym's `+agent_name`: it overrides a row's own `agent_ref`), with the right rewards",
     '`tests/compat/test_nemo_gym_clients.py`', None),
    ('rows routed by `task_source`',
     '`gymserve collect` on NeMo-Gym rows with `task_source: math` and no `agent_ref`: sent to the one '
     "agent whose `resources_server` is `math`, read from the head's `/global_config_dict_yaml` as 0.7.0's"
     ' collector resolves it (an agent instance routes to itself); an unknown `task_source` stops the run '
     'with exit 2 naming it, before any row is sent',
     '`tests/compat/test_nemo_gym_clients.py`, `tests/unit/test_task_source.py`', None),
    ("NeMo-Gym's agent on our servers",
     "NeMo-Gym's own `simple_agent` (its `app.py`, started as `gym env start` starts a server, with our "
     "head's config) runs rollouts against our `resources/math` and `models/stub`: the right rewards",
     '`tests/compat/test_nemo_gym_agents.py`', None),
    ("our agent on NeMo-Gym's servers",
     "NeMo-Gym's own mcqa resources server, registered with our head through `POST /register`, serves our "
     '`simple_agent`: its 5 example rows run unchanged with the right rewards',
     '`tests/compat/test_nemo_gym_agents.py`', None),
    ('`/reverify_mode`',
     "our mcqa and math servers answer `GET /reverify_mode` with a value NeMo-Gym's `ReverifyMode` parses,"
     " the one NeMo-Gym's own server of that environment declares: mcqa `stateless`, math `unknown` (its "
     'verifier may ask a judge)',
     '`tests/compat/test_reverify_mode.py`', None),
    ('our client against a NeMo-Gym head',
     "NeMo-Gym's own `HeadServer` listing our servers with the `/server_instances` rows `gym env start` "
     'writes (`name` the implementation, `config_path` the instance): `gymserve collect --agent '
     'math_simple_agent` finds the agent by its instance name and collects the right rewards, and '
     "`gymserve status` (the head has no `/health/servers`: it probes each listed server's `/health`) "
     'shows every instance ready',
     '`tests/compat/test_nemo_gym_clients.py`', None),
    ('`gymserve prepare --env`',
     'a row our `simple_agent` answers `/run` with a 4xx for (`responses_create_params.temperature: '
     '"hot"`) is reported invalid by `gymserve prepare --env math`, naming the same field: prepare checks '
     "rows with the model agents parse `/run` with, then with the request model the environment's "
     "server parses `/verify` with (typed task fields), then the environment's required fields",
     '`tests/compat/test_nemo_gym_clients.py`, `tests/unit/test_trainer_prepare.py`', None),
    ('the server list',
     '`gym env status` lists every server of the stack as healthy',
     '`tests/compat/test_nemo_gym_clients.py`', None),
    ('complete Responses objects',
     "NeMo-Gym's `NeMoGymResponse` accepts a `models/stub` reply, and its `BaseVerifyRequest` accepts the "
     '`/verify` body our `simple_agent` sends (every field: `parallel_tool_calls`, `tool_choice`, `tools`,'
     ' usage details)',
     '`tests/compat/test_nemo_gym_clients.py`', None),
    ('`/aggregate_metrics`',
     "NeMo-Gym's `AggregateMetrics` model accepts the reply; every metric gymserve names there equals the "
     "one NeMo-Gym's own aggregation computes from the same replies (masked rollouts, repeats, a single "
     'rollout, all masked)',
     '`tests/compat/test_aggregate_metrics.py`', None),
    ('mcqa rewards',
     "NeMo-Gym's own `MCQAResourcesServer.verify` on its 10 example rows (with and without template "
     'metadata) × every response in its recorded rollouts and 19 generated ones (right, wrong, two boxes, '
     '`\\boxed{{B}}`, `\\boxed{C: text}`, option text, empty, unclosed, lowercase, several letters, brace '
     'floods): {count} rewards, all equal',
     '`tests/compat/test_mcqa_differential.py`', 'mcqa'),
    ('math rewards',
     "NeMo-Gym's own math_with_judge `verify` (library check, no judge) on its 5 example rows × every "
     'response in its recorded rollouts and 8 generated ones: equal wherever the response ends in a closed'
     ' `\\boxed{}`; the rest is the intended difference below',
     '`tests/compat/test_math_differential.py`', None),
    ('code_gen rows and rewards',
     "NeMo-Gym's own `CompCodingResourcesServer.verify` on its 5 example rows "
     '(`verifier_metadata.unit_tests`) with their recorded responses and 6 malformed ones, and on small '
     'rows in its format (plain and packed) with 27 generated responses and a `YES` row with 8 (fence '
     'variants, several blocks, spaces and blank lines, float tolerance, `yes`/`YES`, extra tokens and '
     'lines, `__main__` guard, `<think>` tags, empty, unclosed, syntax and runtime errors, `sys.exit`): '
     'all rewards equal, all-or-nothing; our own rows keep partial credit',
     '`tests/compat/test_code_gen_differential.py`', None),
    ('instruction_following rows and rewards',
     "NeMo-Gym's 5 example rows unchanged (top-level fields), and the same rows in its `verifier_metadata`"
     ' format, with its recorded responses: all {count} per-instruction verdicts (IFEval and open-instruct'
     ' ids) and all rewards equal the ones NeMo-Gym recorded (its server cannot run here: it needs '
     '`verifiable-instructions`, which is not on the package index); an id no reference registry has is a '
     '400 naming it',
     '`tests/compat/test_instruction_following_differential.py`', 'instruction_following'),
    ('workplace_assistant rewards',
     "NeMo-Gym's own `WorkbenchResourcesServer.verify` on its 5 example rows × 17 trajectories each (the "
     'ground truth, none, one call short, reordered, doubled, upper-cased values, look-ups first, an extra'
     ' deletion, plot, event, task or customer, a nonexistent id, arguments that are not JSON, an unknown '
     'tool, an unknown argument, an invalid board), plus the 5 responses of its recorded rollouts judged '
     'against each row: {count} rewards, all equal',
     '`tests/compat/test_workplace_assistant_differential.py`', 'workplace_assistant'),
    ('workplace_assistant tools',
     "NeMo-Gym's own 27 tool functions and one gymserve session run the same {count} calls in order "
     '(reads, writes, pagination, date filters, analytics counts, refused arguments): every result equal',
     '`tests/compat/test_workplace_assistant_differential.py`', 'workplace_assistant_tools'),
    ('math with a judge',
     "NeMo-Gym's own math_with_judge `verify` with `should_use_judge` and its own `ServerClient`, and our "
     '`resources/math` with `should_use_judge=true`, ask the same judge (a `models/stub` with one fixed '
     'reply per run: `[[A=B]]`, `[[A!=B]]`, no label, both labels) about its first example row with its '
     'recorded responses and the boxed generated ones: the same answers go to the judge on both sides, and'
     ' the rewards are equal for readable verdicts; the rest is the intended difference below',
     '`tests/compat/test_math_judge_differential.py`', None),
    ('equivalence_llm_judge rewards',
     "NeMo-Gym's own `LLMJudgeResourcesServer.verify` with its own `ServerClient`, and our "
     '`resources/equivalence_llm_judge`, both with its prompt template, ask the same judges (`models/stub`: '
     '`[[A=B]]`, `[[A!=B]]`, no label, both labels, and one scripted by prompt that fails the swap check '
     'and passes the full-generation rescue; the same for `lc_judge`) about its 10 example rows (plain and openqa, per-row '
     '`output_regex`) and 4 made from them (an answer over `extraction_length_threshold`, an `output_regex`'
     ' that is not a regex, `metadata.expected_answer`, a question in text parts then an image turn), each '
     'with every response of its recorded rollouts and 14 generated ones (right, wrong, empty, thinking '
     'only, 6,000 characters, each answer format, two text blocks), under its shipped config, with the swap '
     'check, rescue and `max_answer_chars` on, and under its `lc_judge` config (`CORRECT`/`INCORRECT`, '
     'defaults elsewhere: each side its own): '
     '{count} verdicts; the judge is asked the same questions in the same order, and the rewards are equal'
     ' for readable verdicts; the rest is the intended difference below',
     '`tests/compat/test_equivalence_llm_judge_differential.py`', 'equivalence_llm_judge'),
    ('reasoning_gym rewards',
     "NeMo-Gym's own `ReasoningGymResourcesServer.verify` on its 5 example rows × every response in its "
     'recorded rollouts, plus 10 rows of five more reasoning-gym tasks (`chain_sum`, '
     '`fraction_simplification`, `word_sorting`, `leg_counting`, `basic_arithmetic`) and all 15 rows × 17 '
     'generated responses (tags, boxes, both, two tags, unclosed, empty, brace floods, upper-case tags): '
     '{count} rewards, equal but for the intended difference below',
     '`tests/compat/test_reasoning_gym_differential.py`', 'reasoning_gym'),
    ('`gym eval reverify`',
     "NeMo-Gym's own command re-scores rollouts its collector gathered from our head (rewards overwritten "
     'first) with our `resources/math`, which its launcher starts itself from '
     '`deploy/nemo_gym/resources_servers/gymserve` (below): every reward recomputed right, its aggregate '
     'metrics written, nothing left running',
     '`tests/compat/test_nemo_gym_reverify.py`', None),
    ('the session protocol',
     "NeMo-Gym's own `check_resources_session_contract` (seed, repeated seed, close, repeated close, close"
     ' of a never-seeded id, no seed after close), with seeds its own `ResourcesSeedSessionRequest` '
     'validates, passes on every gymserve environment, each a running server reached through a '
     'pass-through app',
     '`tests/compat/test_session_contract.py`', None),
    ('relay names',
     "each agent's environment-server entry has the name NeMo-Gym would give it",
     '`tests/compat/test_aggregate_metrics.py`', None),
]


def compared(key: str, count: int) -> None:
    """Called by a differential test with the number of cases it compared."""
    assert count == COUNTS[key], (f"docs/nemo-gym-compat.md claims {COUNTS[key]} cases for {key}, the test compared "
                                  f"{count}: update COUNTS in tests/compat/compat_page.py and rerun with "
                                  "GYMSERVE_WRITE_COMPAT=1")


def render() -> str:
    lines = ["| what | NeMo-Gym 0.7.0 side | test |", "|---|---|---|"]
    for what, side, tests, key in ROWS:
        filled = side.replace("{count}", str(COUNTS[key])) if key else side
        lines.append(f"| {what} | {filled} | {tests} |")
    return "\n".join(lines)


def page_table(text: str) -> str:
    return table_between(text, START, END)


def write_page() -> None:
    write_between(PAGE, START, END, render())
