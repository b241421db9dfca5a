"""TRL 1.16 `environment_factory` with gymserve resource servers (workplace, code) behind a real head:
tool methods typed from each server's OpenAPI, sessions seeded by `reset`, the reward from `/verify`,
masked verifies as None, and a GRPO step through `gymserve train`'s `mode: environment_factory` with
TRL's own tool-calling generation (a tiny random Llama with the embedded model's tokenizer)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration._trainer_stack import small_stack

ROOT = Path(__file__).resolve().parents[2]


def _rows(env: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / "datasets" / env / "example.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def stack():
    with small_stack([("resources/workplace", "workplace", []), ("resources/code", "code", [])]) as (head, procs):
        yield head, procs


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


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_gymserve_train_environment_factory(stack, tmp_path):
    """One GRPO step over mixed workplace and code rows: TRL renders each row's tools, generates,
    and scores with the environments' get_reward (a random model earns 0 on both, not None; its
    8 random tokens make no tool call, so tool calls themselves are proven by the tests above)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from services.models.hf.embedded import embedded_model_dir
    from trainer.config import load_config
    from trainer.train import build_trainer

    head, _ = stack
    model_dir = tmp_path / "tiny"
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                 max_position_embeddings=8192)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "rows.jsonl"
    rows = [{**_rows("workplace")[0], "environment": "workplace"},
            {**next(r for r in _rows("code") if r["id"] == "sum_two"), "environment": "code"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config_path = tmp_path / "train.yaml"
    config_path.write_text(json.dumps({
        "mode": "environment_factory", "head_url": head.url, "model": str(model_dir), "train_data": [str(data)],
        "output_dir": str(tmp_path / "out"), "progress": False, "plot": False, "save_final": False,
        "grpo": {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 4,
                 "max_completion_length": 8, "max_tool_calling_iterations": 1, "shuffle_dataset": False}}))
    trainer = build_trainer(load_config(config_path))
    assert set(trainer.environment_factories) == {"workplace", "code"}
    assert "send_email" in {t.__name__ for t in trainer._env_tools["workplace"]}
    assert {t.__name__ for t in trainer._env_tools["code"]} == {"execute_python"}
    try:
        result = trainer.train()
    finally:
        trainer.gymserve_rollouts.close()
    assert result.global_step == 1
    logged = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    # get_reward ran for every rollout: a verdict (0.0), where a failed session or verify would be None
    assert logged["rewards/WorkplaceEnvironment/mean"] == 0.0 and logged["rewards/CodeEnvironment/mean"] == 0.0
    assert "tools/call_frequency" in logged and "loss" in logged
