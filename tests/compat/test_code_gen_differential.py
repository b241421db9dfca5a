"""code against NeMo-Gym 0.7.0's own code_gen server: every example row NeMo-Gym ships with its
recorded response, generated right, wrong, malformed and adversarial responses, and small rows in
NeMo-Gym's format (plain and packed unit tests) go to both `/verify`s; the rewards must be equal.

NeMo-Gym's side runs its `CompCodingResourcesServer.verify` in its own virtualenv, in one process;
its Ray task is replaced by the same function called in a thread (Ray cannot start here; the
function and its arguments are NeMo-Gym's). Ours runs the programs in the real sandbox."""
from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import pytest

from gymserve.testing import ServerProcess
from tests.compat.nemo_gym import text_response

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first compat test may install NeMo-Gym

NEMO_VERIFY = """
import asyncio, sys
import resources_servers.code_gen as package
sys.path.insert(0, package.__path__[0])
from resources_servers.code_gen import app
from lcb_integration.compute_code_generation_metrics import check_correctness
class InThread:
    @staticmethod
    def remote(*args):
        return asyncio.to_thread(check_correctness, *args)
app.check_correctness_remote = InThread
config = app.CompCodingResourcesServerConfig(host="127.0.0.1", port=1, entrypoint="app.py", name="code_gen",
                                             num_processes=2, unit_test_timeout_secs=10, debug=False)
server = app.CompCodingResourcesServer.model_construct(config=config)
server.model_post_init(None)
async def main():
    return [(await server.verify(app.CompCodingVerifyRequest.model_validate(body))).reward for body in data]
print(json.dumps(asyncio.run(main())))
"""

ADD = "a, b = map(int, input().split())\nprint(a + b)"
ADD_TESTS = {"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}
VERDICT_TESTS = {"inputs": ["1\n"], "outputs": ["YES\n"]}


def _data_dir(nemo) -> Path:
    [found] = list(nemo.venv.glob("lib/python3.*/site-packages/resources_servers/code_gen/data"))
    return found


def _row(unit_tests: dict) -> dict:
    return {"responses_create_params": {"input": [{"role": "user", "content": "Solve it."}]},
            "verifier_metadata": {"unit_tests": unit_tests}}


def _packed(unit_tests: dict) -> dict:
    return {"packed": base64.b64encode(zlib.compress(json.dumps(unit_tests).encode())).decode(), "fn_name": None}


def fence(code: str, tag: str = "python") -> str:
    return f"Here is my solution.\n```{tag}\n{code}\n```\nIt reads the input."


UNRUN = ["", "   \n", ADD, f"```python\n{ADD}", "```python```", "<think>x</think>```python\nprint(0)\n```"]
MALFORMED = [*UNRUN, "```python\nimport sys\nsys.exit(1)\n```", "```python\ndef broken(:\n```",
             "```python\nraise ValueError('no')\n```", "```python\nprint(0)\n```"]
ADD_RESPONSES = [
    fence(ADD), fence(ADD, "py"), fence(ADD, ""), fence(ADD, "Python3"),
    fence("print(0)") + "\n" + fence(ADD),  # the last block counts
    fence(ADD) + "\n" + fence("print(0)"),
    fence("a, b = map(int, input().split())\nprint(f'  {a + b}   ')"),  # surrounding spaces
    fence("a, b = map(int, input().split())\nprint()\nprint(a + b)\nprint()"),  # blank lines around
    fence("a, b = map(int, input().split())\nprint(float(a + b) + 1e-9)"),  # within float tolerance
    fence("a, b = map(int, input().split())\nprint(float(a + b) + 1e-3)"),  # beyond it
    fence("a, b = map(int, input().split())\nprint(a + b, 0)"),  # an extra token
    fence("a, b = map(int, input().split())\nprint(a + b)\nprint(a + b)"),  # an extra line
    fence("a, b = map(int, input().split())\nprint(a - b)"),
    fence("import sys\na, b = map(int, sys.stdin.read().split())\nsys.stdout.write(str(a + b))"),
    fence("def main():\n    a, b = map(int, input().split())\n    print(a + b)\n\nif __name__ == '__main__':\n"
          "    main()"),
    "<think>easy</think>\n" + fence(ADD),  # a think tag in the final answer
    fence(ADD) + "\n</think>",
    *MALFORMED,
]
VERDICT_RESPONSES = [fence(f"input()\nprint({word!r})") for word in ("YES", "yes", "Yes", " yes ", "YES!", "no",
                                                                       "Y E S")] + [""]


def test_rewards_equal_nemo_gyms_on_its_rows_and_generated_responses(nemo, workdir):
    data = _data_dir(nemo)
    rows = [json.loads(line) for line in (data / "example.jsonl").read_text().splitlines()]
    recorded = [json.loads(line) for line in (data / "example_rollouts.jsonl").read_text().splitlines()]
    by_prompt = {row["responses_create_params"]["input"][0]["content"]: row for row in rows}
    bodies = []
    for rollout in recorded:  # each recorded response with its own row (rollouts carry no metadata)
        row = by_prompt[rollout["responses_create_params"]["input"][0]["content"]]
        bodies.append({**row, "response": rollout["response"]})
    for row in rows:
        bodies += [{**row, "response": text_response(text)} for text in UNRUN]  # judged without running
    bodies += [{**_row(ADD_TESTS), "response": text_response(text)} for text in ADD_RESPONSES]
    bodies += [{**_row(_packed(ADD_TESTS)), "response": text_response(text)} for text in ADD_RESPONSES[:3]]
    bodies += [{**_row(VERDICT_TESTS), "response": text_response(text)} for text in VERDICT_RESPONSES]

    theirs = nemo.python_json(NEMO_VERIFY, bodies, workdir)
    with ServerProcess("resources/code", "timeout_s=10") as server:
        replies = [server.post("/verify", body).json() for body in bodies]
        # The intended difference: call-based rows (unit_tests.fn_name) are refused with a 4xx naming
        # the field; NeMo-Gym imports the program into its own process to call the function
        call_based = server.post("/verify", {**_row({**ADD_TESTS, "fn_name": "add"}), "response": text_response("")})
    assert call_based.status_code in (400, 422) and "fn_name" in call_based.text
    assert not [r for r in replies if r.get("mask_sample")], "no reply may be masked here"
    ours = [r["reward"] for r in replies]
    differ = [(i, bodies[i]["response"]["output"][-1]["content"][0]["text"][-120:], ours[i], theirs[i])
              for i in range(len(bodies)) if ours[i] != theirs[i]]
    assert not differ, f"{len(differ)} of {len(bodies)} rewards differ: {differ[:10]}"
    recorded_rewards = [rollout["reward"] for rollout in recorded]
    assert ours[:len(recorded)] == recorded_rewards and 0 < sum(ours) < len(ours)
