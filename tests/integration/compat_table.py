"""The trainer compatibility table of docs/trainer-compat.md, one row per framework, each row
written next to the tests that prove it (named in `proven_by`). `render()` is the Markdown the
page carries between its compat-table markers; `test_compat_table_is_current` compares them."""
from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

from tests.generated_docs import table_between, write_between

from tests.integration.nemo_rl_excerpts import COMMIT

PAGE = Path(__file__).resolve().parents[2] / "docs" / "trainer-compat.md"
START, END = "<!-- compat-table:start -->", "<!-- compat-table:end -->"
COLUMNS = ["framework", "version tested", "what works", "masked failures", "a user adds", "proven by"]


def rows() -> list[dict[str, str]]:
    return [
        {"framework": "TRL `rollout_func`", "version tested": f"trl {version('trl')} (installed)",
         "what works": "GRPO/GDPO through agents' `/run` (`gymserve train`)",
         "masked failures": "every reward None: TRL leaves the rollout out of the group baseline, advantage 0",
         "a user adds": "nothing (`gymserve train -c`)",
         "proven by": "`tests/integration/test_trainer_train_e2e.py`"},
        {"framework": "TRL `environment_factory`", "version tested": f"trl {version('trl')} (installed)",
         "what works": "one environment class per resource server, tools typed from its OpenAPI, "
                       "`reset` seeds a session, `get_reward` verifies it; a dict of factories for mixed rows; "
                       "one GRPO step in `gymserve train` in which TRL's own tool-calling generation makes a tiny "
                       "taught model call `send_email` (workplace) and `execute_python` (code): the servers count "
                       "the calls, `/verify` scores 1.0",
         "masked failures": "`get_reward` returns None (a broken sandbox's masked verify, in that step): TRL leaves "
                            "the rollout out of the group baseline, advantage 0",
         "a user adds": "`mode: environment_factory` in the train config",
         "proven by": "`tests/integration/test_trl_environment_factory.py`"},
        {"framework": "NeMo RL", "version tested": f"main at {COMMIT[:10]} and v0.7.0 (source excerpts)",
         "what works": "`register` + `create_env`, training and evaluation `step`, multi-reward as "
                       "`reward/<name>` dict (main) or (B, K) tensor (v0.7)",
         "masked failures": "no per-sample mask on the generic path: the step raises (default) or "
                            "scores 0 with a logged, counted warning (`on_failure: count`)",
         "a user adds": "`register(name)` before `create_env`; gymserve on `PYTHONPATH`",
         "proven by": "`tests/integration/test_nemo_rl_adapter.py`"},
        {"framework": "verl", "version tested": "verl 0.9.1 (`--no-deps`, reward and agent loops)",
         "what works": "`compute_score` loaded by `get_custom_reward_fn`, scored by the `naive` and `gdpo` reward "
                       "managers (components in `reward_extra_info`); the agent-loop slot (`gymserve_agent`, built "
                       "as verl's worker builds a loop): a tool-calling trajectory's token ids, response mask, "
                       "logprobs and reward; not verl's `AgentLoopWorker` itself (a Ray actor over vLLM/SGLang)",
         "masked failures": "no per-sample mask: the reward step raises (default), or 0 with `mask_sample` 1 "
                            "(`GYMSERVE_VERL_ON_FAILURE=zero`)",
         "a user adds": "`reward.custom_reward_function.path: pkg://trainer.adapters.verl`, or rows with "
                        "`agent_name: gymserve_agent` and `extra_info.gym_row`; gymserve on `PYTHONPATH`",
         "proven by": "`tests/integration/test_verl_reward_manager.py`, `tests/integration/test_verl_agent_loop.py`"},
        {"framework": "OpenRLHF", "version tested": "openrlhf 0.11.2 (`--no-deps`, client and samples generator)",
         "what works": "its remote reward client with our reward file (`--remote_rm_url .../openrlhf_reward.py`) "
                       "on a keyed head's `/get_reward` (the plain URL gets 401: no key); the reply becomes an "
                       "Experience",
         "masked failures": "no per-sample mask: reward 0 with `extra_logs.mask_sample` 1, counted in its logs "
                            "(also when the head is unreachable)",
         "a user adds": "`head.openrlhf_environment` in the stack; `--remote_rm_url` to "
                        "`trainer/adapters/openrlhf_reward.py`; gymserve on `PYTHONPATH`",
         "proven by": "`tests/integration/test_openrlhf_remote_rm.py`"},
    ]


def render() -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row[c] for c in COLUMNS) + " |" for row in rows()]
    return "\n".join(lines)


def page_table(text: str) -> str:
    return table_between(text, START, END)


def write_page() -> None:
    write_between(PAGE, START, END, render())
