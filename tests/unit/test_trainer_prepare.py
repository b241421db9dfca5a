"""`gymserve prepare`: mapping, agent_ref stamping, per-line validation, blending, splitting."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.prepare import DatasetSpec, PrepareError, PrepareOptions, blend, prepare


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_plain_rows_are_mapped_stamped_and_split(tmp_path):
    src = _write(tmp_path / "plain.jsonl", [{"question": f"q{i}", "answer": str(i), "extra": i} for i in range(20)])
    (tmp_path / "tmpl.txt").write_text("Solve: {input}\nPut the answer in \\boxed{}.")
    spec = DatasetSpec(source=str(src), agent="math_simple_agent", input_key="question", output_key="answer",
                       system_prompt="be brief", prompt_file=str(tmp_path / "tmpl.txt"), task_name="toy")
    result = prepare(PrepareOptions(output_dir=str(tmp_path / "out"), datasets=[spec], validation_ratio=0.25, seed=3))
    train, val = _read(tmp_path / "out/train.jsonl"), _read(tmp_path / "out/validation.jsonl")
    assert (len(train), len(val)) == (15, 5) == (result["train_rows"], result["validation_rows"])
    assert {r["extra"] for r in train} | {r["extra"] for r in val} == set(range(20))
    row = train[0]
    msgs = row["responses_create_params"]["input"]
    assert msgs[0] == {"role": "system", "content": "be brief"}
    assert msgs[1]["role"] == "user" and msgs[1]["content"] == f"Solve: q{row['extra']}\nPut the answer in \\boxed{{}}."
    assert row["expected_answer"] == str(row["extra"]) and "answer" not in row and "question" not in row
    assert row["agent_ref"] == {"type": "responses_api_agents", "name": "math_simple_agent"}
    assert row["task_name"] == "toy"
    stats = json.loads((tmp_path / "out/stats.json").read_text())
    assert stats["datasets"][0]["env"] == "math" and stats["datasets"][0]["validation_rows"] == 5
    # same seed -> same split; other seed -> another split
    prepare(PrepareOptions(output_dir=str(tmp_path / "again"), datasets=[spec], validation_ratio=0.25, seed=3))
    assert _read(tmp_path / "again/validation.jsonl") == val
    prepare(PrepareOptions(output_dir=str(tmp_path / "other"), datasets=[spec], validation_ratio=0.25, seed=4))
    assert _read(tmp_path / "other/validation.jsonl") != val


def test_validation_errors_name_each_line(tmp_path):
    src = _write(tmp_path / "bad.jsonl", [
        {"input": "1+1?", "output": "2"},
        {"input": "no answer"},
        {"responses_create_params": {"input": []}, "expected_answer": "x"},
    ])
    with pytest.raises(PrepareError) as info:
        prepare(PrepareOptions(output_dir=str(tmp_path / "o"), datasets=[DatasetSpec(str(src), agent="math_simple_agent")]))
    message = str(info.value)
    assert f"{src}:2: missing field expected_answer (required by environment math)" in message
    assert f"{src}:3: responses_create_params.input: missing or empty" in message
    assert f"{src}:1" not in message
    result = prepare(PrepareOptions(output_dir=str(tmp_path / "o"), skip_invalid=True,
                                    datasets=[DatasetSpec(str(src), agent="math_simple_agent")]))
    assert result["train_rows"] == 1 and result["skipped_invalid"] == 2
    assert "bad.jsonl:2" in (tmp_path / "o/skipped.txt").read_text()


def test_missing_agent_ref_is_reported(tmp_path):
    src = _write(tmp_path / "a.jsonl", [{"input": "x", "output": "y"}])
    with pytest.raises(PrepareError, match=r"a.jsonl:1: agent_ref.name: missing"):
        prepare(PrepareOptions(output_dir=str(tmp_path / "o"), datasets=[DatasetSpec(str(src))]))


def test_blend_weights_and_upsampling():
    import random
    a = [{"d": "a", "i": i} for i in range(10)]
    b = [{"d": "b", "i": i} for i in range(2)]
    pa, pb = blend([a, b], [3.0, 1.0], 40, random.Random(0))
    assert (len(pa), len(pb)) == (30, 10)
    assert {r["i"] for r in pb} == {0, 1}  # upsampled by repetition
    assert sorted(r["i"] for r in pa[:10]) == list(range(10))  # every row once before repeating
    with pytest.raises(PrepareError, match="weights"):
        blend([a], [0.0], None, random.Random(0))


def test_hf_dataset_folder_offline_and_cli(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list([{"input": f"What is {i}+{i}?", "output": str(2 * i)} for i in range(6)])
    ds.save_to_disk(str(tmp_path / "hf"))
    em = _write(tmp_path / "em.jsonl", [{"responses_create_params": {"input": [{"role": "user", "content": "hi"}]},
                                         "agent_ref": {"name": "exact_match_simple_agent"}, "expected_answer": "hi"}] * 3)
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "gymserve", "prepare", "-i", str(tmp_path / "hf"), "-o", str(out),
                             "--agent", "math_simple_agent", "--num-rows", "8"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    train = _read(out / "train.jsonl")
    assert len(train) == 8 and all(r["agent_ref"]["name"] == "math_simple_agent" for r in train)
    # a config file blending two datasets with their own agents
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"output_dir: {tmp_path / 'blend'}\nvalidation_ratio: 0.2\nseed: 1\nnum_rows: 10\ndatasets:\n"
                   f"  - {{source: {tmp_path / 'hf'}, agent: math_simple_agent, weight: 1}}\n"
                   f"  - {{source: {em}, weight: 1}}\n")
    result = subprocess.run([sys.executable, "-m", "gymserve", "prepare", "-c", str(cfg)], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    stats = json.loads((tmp_path / "blend/stats.json").read_text())
    assert [d["env"] for d in stats["datasets"]] == ["math", "exact_match"]
    names = [r["agent_ref"]["name"] for r in _read(tmp_path / "blend/train.jsonl")]
    assert names.count("math_simple_agent") == names.count("exact_match_simple_agent") == 5
    # a bad file: exit 2 and the line named
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input": "x", "output": "y"}\n[1, 2]\n')
    result = subprocess.run([sys.executable, "-m", "gymserve", "prepare", "-i", str(bad), "-o", str(tmp_path / "b"),
                             "--agent", "math_simple_agent"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "bad.jsonl:2: expected a JSON object" in result.stderr


def test_reasoning_gym_subcommand(tmp_path):
    out = tmp_path / "rg.jsonl"
    result = subprocess.run([sys.executable, "-m", "gymserve", "prepare", "reasoning-gym", "--task", "basic_arithmetic",
                             "--size", "3", "--seed", "5", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = _read(out)
    assert len(rows) == 3 and all(r["agent_ref"]["name"] == "reasoning_gym_simple_agent" for r in rows)
    result = subprocess.run([sys.executable, "-m", "gymserve", "prepare", "reasoning-gym", "--task", "nope",
                             "--size", "3", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "nope" in result.stderr


def test_swe_bench_rows_get_the_issue_prompt_and_tools(tmp_path):
    shipped = [json.loads(line) for line in (Path(__file__).resolve().parents[2] / "datasets/swe/example.jsonl")
               .read_text().splitlines()]
    raw = [{k: v for k, v in row.items() if k != "responses_create_params"} for row in shipped]
    src = _write(tmp_path / "swe.jsonl", raw + [{"instance_id": "x", "problem_statement": "p", "FAIL_TO_PASS": "[]"}])
    spec = DatasetSpec(source=str(src), agent="swe_simple_agent")
    with pytest.raises(PrepareError, match="repo_snapshot or image"):
        prepare(PrepareOptions(output_dir=str(tmp_path / "bad"), datasets=[spec]))
    spec = DatasetSpec(source=str(_write(tmp_path / "ok.jsonl", raw)), agent="swe_simple_agent")
    prepare(PrepareOptions(output_dir=str(tmp_path / "out"), datasets=[spec]))
    rows = {r["instance_id"]: r for r in _read(tmp_path / "out/train.jsonl")}
    for row in raw:
        params = rows[row["instance_id"]]["responses_create_params"]
        assert params["input"][-1] == {"role": "user", "content": row["problem_statement"]}
        assert {t["name"] for t in params["tools"]} == {"bash", "read_file", "write_file", "apply_patch"}
        assert rows[row["instance_id"]]["FAIL_TO_PASS"] == row["FAIL_TO_PASS"]


def test_rows_the_agents_model_rejects_are_invalid_naming_the_field(tmp_path):
    """prepare checks rows with the model agents parse `POST /run` with (`DatasetRow`)."""
    from pydantic import ValidationError

    from services.core.schemas import DatasetRow

    bad = {"responses_create_params": {"input": "2+2?", "temperature": "hot"}, "expected_answer": "4"}
    with pytest.raises(ValidationError):
        DatasetRow.model_validate(bad)
    src = _write(tmp_path / "bad.jsonl", [bad, {**bad, "responses_create_params": {"input": "2+2?"}}])
    with pytest.raises(PrepareError) as info:
        prepare(PrepareOptions(output_dir=str(tmp_path / "o"),
                               datasets=[DatasetSpec(str(src), agent="math_simple_agent", env="math")]))
    assert f"{src}:1: responses_create_params.temperature:" in str(info.value)
    assert f"{src}:2" not in str(info.value)


@pytest.mark.parametrize("env,fields,says", [
    ("code", {"tests": "print(1)"}, "tests: Input should be a valid list"),
    ("code", {"tests": [{"input": "1", "output": "1"}], "reward_mode": "half"}, "reward_mode: Input should be"),
    ("mcqa", {"expected_answer": "B", "options": "A or B"}, "options"),
])
def test_typed_task_fields_are_checked_with_the_servers_own_request_model(env, fields, says):
    from services.core.loader import load_server
    from trainer.env_fields import PLACEHOLDER_RESPONSE, request_model, row_problems

    row = {"responses_create_params": {"input": [{"role": "user", "content": "q"}]},
           "agent_ref": {"name": f"{env}_simple_agent"}, **fields}
    problems = row_problems(row, env)
    assert any(says in p and f"environment {env}" in p for p in problems), problems
    # the very model the server parses /verify with: it rejects the same row
    model = request_model(env)
    assert model is not None and model.__module__ == load_server(f"resources/{env}").__name__
    with pytest.raises(ValueError):
        model.model_validate({**row, "response": PLACEHOLDER_RESPONSE})
