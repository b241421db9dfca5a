"""Real servers for the contract tests, started in parallel and shared by the whole package."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator

from gymserve.testing import ServerProcess, response_with_text

ROOT = Path(__file__).resolve().parents[2]

# Every environment, with options that keep it small (one worker) on a 2-core CI machine.
ENVIRONMENTS: dict[str, tuple[str, ...]] = {
    "exact_match": (),
    "code_jaccard": (),
    "mcqa": ("workers=1",),
    "instruction_following": ("workers=1",),
    "math": ("workers=1",),
    "math_multi_reward": (),
    "reasoning_gym": ("workers=1",),
    "workplace": (),
    "workplace_assistant": (),
    "code": ("timeout_s=5", "prestart=0", "max_concurrency=2"),
    "equivalence_llm_judge": (),
    "llm_judge": (),
    "genrm_compare": (),
    "terminal": ("warm_pool=0", "limits.wall_s=5"),
    "swe": ("warm_pool=0",),
}
# Environments that call a judge model: pointed at one scripted judge (`judge_server`).
JUDGED = frozenset({"equivalence_llm_judge", "llm_judge", "genrm_compare"})


def judge_server() -> ServerProcess:
    """A scripted judge that says "equal" (and scores 7) to every question (the judged environments' contract is
    about their own inputs and replies; judge outcomes are tested in tests/integration/test_judge.py)."""
    return ServerProcess("models/stub", name="contract-judge", ready_timeout_s=180,
                         env={"GYMSERVE_SERVER_SPEC": json.dumps({"text": "Verdict [[A=B]], score [[7]]"})})


def options_for(env: str, judge: ServerProcess) -> tuple[str, ...]:
    return (*ENVIRONMENTS[env], *((f"judge_model_server={judge.url}",) if env in JUDGED else ()))


def start_all(servers: list[ServerProcess]) -> list[ServerProcess]:
    """Start `servers` concurrently; if one fails, stop the others and raise."""
    with ThreadPoolExecutor(max_workers=len(servers)) as pool:
        futures = [pool.submit(server.start) for server in servers]
        errors = [f.exception() for f in futures]
    if any(errors):
        stop_all(servers)
        raise next(e for e in errors if e)
    return servers


def stop_all(servers: list[ServerProcess]) -> None:
    for server in servers:
        server.stop()
        Path(server._logfile.name).unlink(missing_ok=True)


@contextmanager
def running_environments(prefix: str) -> Iterator[dict[str, ServerProcess]]:
    """Every environment's server (named `{prefix}-{env}`), the judged ones pointed at one scripted judge."""
    judge = judge_server()
    servers = {env: ServerProcess(f"resources/{env}", *options_for(env, judge), name=f"{prefix}-{env}",
                                  ready_timeout_s=180) for env in ENVIRONMENTS}
    start_all([judge, *servers.values()])
    try:
        yield servers
    finally:
        stop_all([judge, *servers.values()])


def examples(env: str) -> list[dict[str, Any]]:
    lines = (ROOT / "datasets" / env / "example.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def answer_text(env: str, row: dict[str, Any]) -> str:
    """A plausible model answer for `row` (right where it is easy, so rewards are not all 0)."""
    expected = row.get("expected_answer", row.get("ground_truth"))
    if env == "exact_match" or env == "code_jaccard":
        return str(expected)
    if env == "math":
        return f"The answer is \\boxed{{{expected}}}."
    if env == "mcqa":
        return f"Answer: {expected}"
    if env == "math_multi_reward":
        return f"<think>\nadd them\n</think>\n<answer>\n{expected}\n</answer>"
    if env == "reasoning_gym":
        entry = row.get("reasoning_gym_entry") or row
        return f"<answer>{entry.get('answer')}</answer>"
    if env == "equivalence_llm_judge":
        return f"It was {expected}."
    if env == "code":
        return "```python\nimport sys\nprint(sys.stdin.read().strip())\n```"
    if env == "swe":
        return f"```diff\n{row['patch']}```"
    return "<<A title>>\nA short answer without commas that is all lowercase."


def verify_body_for(env: str, row: dict[str, Any]) -> dict[str, Any]:
    """A valid `/verify` body: the row (minus its routing) plus a response."""
    body = {k: v for k, v in row.items() if k != "agent_ref"}
    body["response"] = response_with_text(answer_text(env, row))
    if env in ("workplace", "workplace_assistant"):  # the model's tool calls are replayed when there is no live session
        body["response"]["output"] = [{"type": "function_call", "call_id": f"call_{i}", "name": call["name"],
                                       "arguments": call["arguments"]} for i, call in enumerate(row["ground_truth"])]
    return body
