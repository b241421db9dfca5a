"""TRL 1.16 `environment_factory` with gymserve resource servers (workplace, code) behind a real head:
tool methods typed from each server's OpenAPI, sessions seeded by `reset`, the reward from `/verify`,
masked verifies as None, and a GRPO step through `gymserve train`'s `mode: environment_factory` in
which TRL's own tool-calling generation makes a tiny model (taught by tests/integration/trl_taught_model.py)
call `send_email` on workplace and `execute_python` on code, and a broken sandbox masks a verify."""
from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration._trainer_stack import small_stack

ROOT = Path(__file__).resolve().parents[2]


def _rows(env: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / "datasets" / env / "example.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def stack():
    """workplace, code, and `code_broken`: a code server whose sandbox breaks once it is up (its
    bubblewrap is a wrapper that fails while a marker file exists: an injected infrastructure fault).
    The wrapper's folder is readable by the sandbox user (uid 65534, what bwrap runs as under root)."""
    folder = Path(tempfile.mkdtemp(prefix="gymserve-test-"))
    folder.chmod(0o755)
    marker, wrapper = folder / "broken", folder / "bwrap"
    wrapper.write_text(f"#!/bin/sh\nif [ -e {marker} ]; then echo 'bwrap: simulated setup failure' >&2; exit 1; fi\n"
                       f"exec {shutil.which('bwrap')} \"$@\"\n")
    wrapper.chmod(0o755)
    servers = [("resources/workplace", "workplace", []), ("resources/code", "code", []),
               ("resources/code", "code_broken", [f"bwrap_path={wrapper}", "prestart=0"])]
    try:
        with small_stack(servers) as (head, procs):
            marker.touch()
            yield head, procs
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def factories(stack):
    from trainer.environment_factory import environments

    head, _ = stack
    return environments(["workplace", "code"], head_url=head.url)


def test_tools_are_typed_methods_trl_can_schema(factories):
    from transformers.utils import get_json_schema

    workplace = factories["workplace"]()
    schema = get_json_schema(workplace.send_email)["function"]  # what TRL renders into the prompt
    assert schema["name"] == "send_email"
    assert schema["parameters"]["required"] == ["recipient", "subject", "body"]
    assert schema["parameters"]["properties"]["recipient"]["type"] == "string"
    assert get_json_schema(workplace.update_event)["function"]["parameters"]["properties"]["duration"]["type"] \
        == "integer"
    code = factories["code"]()
    assert get_json_schema(code.execute_python)["function"]["parameters"]["required"] == ["code"]
    public = {name for name in vars(type(workplace)) if callable(getattr(workplace, name)) and not name.startswith("_")}
    assert "send_email" in public and not {"reset", "get_reward"} & public  # inherited, not tools


def test_workplace_session_tools_and_reward(factories):
    from trainer.environment_factory import completion_recorder

    row = _rows("workplace")[0]
    env = factories["workplace"]()
    prompt = env.reset(gymserve_row=json.dumps(row), prompt=[{"role": "user", "content": ""}])
    assert prompt == row["responses_create_params"]["input"][-1]["content"]
    call = row["ground_truth"][0]
    output = getattr(env, call["name"])(**json.loads(call["arguments"]))
    assert "error" not in output.lower()
    completion_recorder([[{"role": "assistant", "content": "Done."}]], environments=[env])
    assert env.get_reward() == 1.0 and env.last_reply["state_source"] == "session"
    other = factories["workplace"]()  # an instance of its own: its session does not see the first one's email
    other.reset(**row)
    assert "Error 400" in other.send_email(recipient="not an email", subject="s", body="b")  # the model may retry
    assert other.get_reward() == 0.0


def test_code_session_and_reward(factories):
    from trainer.environment_factory import completion_recorder

    row = next(r for r in _rows("code") if r["id"] == "sum_two")
    env = factories["code"]()
    assert "two integers" in env.reset(**row)
    assert "42" in env.execute_python(code="print(40 + 2)")
    program = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    completion_recorder([[{"role": "assistant", "content": program}]], environments=[env])
    assert env.get_reward() == 1.0


def test_unverifiable_rollout_reaches_trl_as_none(factories):
    row = {k: v for k, v in _rows("workplace")[0].items() if k != "ground_truth"}
    env = factories["workplace"]()
    env.reset(**row)
    assert env.get_reward() is None  # the server rejects the row: no verdict


def test_server_gone_before_verify_is_none():
    from gymserve.testing import ServerProcess
    from trainer.environment_factory import environment_class

    with ServerProcess("resources/workplace", name="workplace_gone") as server:
        env = environment_class("workplace", server.url)()
        env.reset(**_rows("workplace")[0])
    assert env.get_reward() is None  # connection refused: no verdict, never 0


def _counter(server, name: str, **labels: str) -> float:
    """A counter of the server's own /metrics (what it served, not what the client believes)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def _tool_posts(server, tool: str) -> float:
    return _counter(server, "gymserve_requests_total", method="POST", path=f"/{tool}", status="200")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gymserve_train_environment_factory_calls_tools(stack, factories, tmp_path):
    """One GRPO step over a workplace, a code and a code_broken row (2 generations each), with TRL's
    own generation and tool-calling loop: the taught model calls each row's tool, the servers count
    those calls, `get_reward` scores 1.0 from `/verify` on both, and the broken sandbox's masked
    verify reaches TRL as None (unscorable: advantage 0)."""
    from tests.integration.trl_taught_model import Lesson, taught_environment_model
    from services.models.hf.tiny import CODE_ANSWER, CODE_CALL
    from trainer.config import load_config
    from trainer.train import build_trainer

    head, procs = stack
    workplace_row = _rows("workplace")[0]
    code_row = next(r for r in _rows("code") if r["id"] == "sum_two")
    email = workplace_row["ground_truth"][0]
    model_dir = taught_environment_model(factories, [
        Lesson("workplace", workplace_row, email["name"], json.loads(email["arguments"]), "Done: the email is sent."),
        Lesson("code", code_row, CODE_CALL["name"], CODE_CALL["arguments"], CODE_ANSWER)])
    data = tmp_path / "rows.jsonl"
    rows = [{**workplace_row, "environment": "workplace"}, {**code_row, "environment": "code"},
            {**code_row, "environment": "code_broken"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config_path = tmp_path / "train.yaml"
    config_path.write_text(json.dumps({
        "mode": "environment_factory", "head_url": head.url, "model": str(model_dir), "train_data": [str(data)],
        "output_dir": str(tmp_path / "out"), "progress": False, "plot": False, "save_final": False,
        # one optimizer step over three generation batches, one row (2 rollouts) each in the rows' order: TRL
        # pads a batch to its longest prompt, and the workplace prompt (19 tool schemas) is 13 times the code one
        "grpo": {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 2,
                 "gradient_accumulation_steps": 3, "steps_per_generation": 1, "top_k": 1,
                 "max_completion_length": 256, "max_tool_calling_iterations": 1, "shuffle_dataset": False}}))
    trainer = build_trainer(load_config(config_path))
    assert set(trainer.environment_factories) == {"workplace", "code", "code_broken"}
    assert "send_email" in {t.__name__ for t in trainer._env_tools["workplace"]}
    assert {t.__name__ for t in trainer._env_tools["code"]} == {"execute_python"}
    before = {"send_email": _tool_posts(procs["workplace"], "send_email"),
              "execute_python": _tool_posts(procs["code"], "execute_python"),
              "sandbox": _counter(procs["code_broken"], "gymserve_failures_total", kind="sandbox")}
    try:
        result = trainer.train()
    finally:
        trainer.gymserve_rollouts.close()
    assert result.global_step == 1
    # the servers served the model's tool calls: two rollouts of each row called its tool once
    assert _tool_posts(procs["workplace"], "send_email") - before["send_email"] == 2
    assert _tool_posts(procs["code"], "execute_python") - before["execute_python"] == 2
    # the broken sandbox masked both code_broken verifies (the server counts them by failure kind)
    assert _counter(procs["code_broken"], "gymserve_failures_total", kind="sandbox") - before["sandbox"] == 2
    replies = {name: [env.last_reply for env in pool] for name, pool in trainer._environment_pool.items()}
    assert all(r["reward"] == 1.0 and r["state_source"] == "session" and not r["mismatched_tables"]
               for r in replies["workplace"])  # the email the tool call sent is in the session's database
    assert all(r["reward"] == 1.0 and r["tests_passed"] == 3 for r in replies["code"])
    assert all(r["mask_sample"] and r["failure_kind"] == "sandbox" for r in replies["code_broken"])
    # what TRL's tool loop handed each environment: the servers' replies (the verify echoes them back)
    outputs = {name: [item["output"] for env in pool for item in env._items if item["type"] == "function_call_output"]
               for name, pool in trainer._environment_pool.items()}
    assert outputs["workplace"] == ['{"status":"sent","email_id":"EMN001"}'] * 2  # each rollout its own session
    assert all('"stdout":"5\\n"' in out and '"sandbox":"bwrap"' in out for out in outputs["code"])
    assert len(outputs["code"]) == 2
    assert all('"failure_kind":"sandbox"' in out for out in outputs["code_broken"]) and len(outputs["code_broken"]) == 2
    logged = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    assert logged["rewards/WorkplaceEnvironment/mean"] == 1.0 and logged["rewards/CodeEnvironment/mean"] == 1.0
    assert logged["rewards/CodeBrokenEnvironment/mean"] is None  # every value None: TRL logs no mean
    assert logged["tools/call_frequency"] == 1.0 and "loss" in logged
    # TRL's record of the last generation batch (the code_broken row): the masked tool result in each
    # completion, no reward function scored it (unscorable), advantage 0: never trained as a 0
    completions, rewards = list(trainer._logs["completion"]), trainer._logs["rewards"]
    assert len(completions) == 2
    for i, completion in enumerate(completions):
        assert any(m["role"] == "tool" and '"failure_kind":"sandbox"' in m["content"] for m in completion)
        assert all(math.isnan(values[i]) for values in rewards.values())
        assert trainer._logs["advantages"][i] == 0.0
