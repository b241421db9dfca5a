"""Dataset preparation: load (JSONL or Hugging Face), map plain rows to NeMo-Gym rows,
stamp `agent_ref`, validate against the environment's required fields, split off
validation, blend by weight, write `train.jsonl`, `validation.jsonl`, `stats.json`.

Validation is split per dataset before blending, so every dataset is represented in it
and no validation row is ever duplicated into train by upsampling.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .env_fields import env_of_agent, row_problems
from .jsonl import JsonlError, iter_jsonl, write_jsonl


class PrepareError(ValueError):
    """Bad input; the message lists every problem (per line where there is one)."""


@dataclass
class DatasetSpec:
    source: str
    weight: float = 1.0
    config: str | None = None
    split: str = "train"
    agent: str | None = None
    env: str | None = None
    input_key: str = "input"
    output_key: str = "output"
    answer_field: str = "expected_answer"
    system_prompt: str | None = None
    system_prompt_file: str | None = None
    prompt_file: str | None = None
    task_name: str | None = None
    max_rows: int | None = None
    require: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return Path(self.source).stem if Path(self.source).suffix else self.source


@dataclass
class PrepareOptions:
    output_dir: str
    datasets: list[DatasetSpec]
    validation_ratio: float = 0.0
    seed: int = 0
    num_rows: int | None = None
    skip_invalid: bool = False


def load_source(spec: DatasetSpec) -> list[tuple[str, dict[str, Any]]]:
    """(where, raw row) pairs; `where` is `file:line` for JSONL and `name[index]` for HF data."""
    path = Path(spec.source)
    if path.is_file():
        out = []
        problems = []
        try:
            items = list(iter_jsonl(path))
        except JsonlError as exc:
            raise PrepareError(str(exc)) from None
        for lineno, value in items:
            if isinstance(value, dict):
                out.append((f"{path}:{lineno}", value))
            else:
                problems.append(f"{path}:{lineno}: expected a JSON object, got {type(value).__name__}")
        if problems:
            raise PrepareError("\n".join(problems))
        return out
    return [(f"{spec.label}[{i}]", dict(row)) for i, row in enumerate(_load_hf(spec))]


def _load_hf(spec: DatasetSpec) -> Iterable[dict[str, Any]]:
    try:
        import datasets
    except ImportError:  # pragma: no cover - an install without the ml extra
        raise PrepareError("loading a Hugging Face dataset needs the `datasets` package (pip install datasets)") from None
    path = Path(spec.source)
    try:
        if path.is_dir() and ((path / "state.json").exists() or (path / "dataset_dict.json").exists()):
            data = datasets.load_from_disk(str(path))  # written by save_to_disk
            if isinstance(data, datasets.DatasetDict):
                if spec.split not in data:
                    raise PrepareError(f"{spec.source}: no split {spec.split!r} (splits: {', '.join(data)})")
                data = data[spec.split]
        else:
            data = datasets.load_dataset(spec.source, spec.config, split=spec.split)
    except PrepareError:
        raise
    except Exception as exc:  # datasets raises many types; name the source
        raise PrepareError(f"{spec.source}: cannot load dataset: {type(exc).__name__}: {exc}") from None
    return data


def _read_text(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PrepareError(f"cannot read {path}: {exc}") from None


SWE_SYSTEM_PROMPT = ("You fix an issue in the repository in /workspace using the tools. Change the code, not the "
                     "tests; run the tests with `python3 -m pytest`. Stop when the issue is fixed.")


def is_swe_bench_row(row: dict[str, Any]) -> bool:
    """SWE-bench's row format (SWE-bench, SWE-rebench, SWE-Gym): an issue plus its tests."""
    return isinstance(row.get("problem_statement"), str) and "FAIL_TO_PASS" in row and "instance_id" in row


def swe_bench_prompt(row: dict[str, Any]) -> dict[str, Any]:
    """The prompt and the workspace tools of the swe environment for a SWE-bench row."""
    from services.core.sandbox.environment import TOOL_SPECS

    return {"input": [{"role": "system", "content": SWE_SYSTEM_PROMPT},
                      {"role": "user", "content": row["problem_statement"]}], "tools": TOOL_SPECS}


def to_gym_row(raw: dict[str, Any], spec: DatasetSpec, *, system_prompt: str | None,
               template: str | None) -> dict[str, Any]:
    """A NeMo-Gym row from a raw one. Rows that already have `responses_create_params`
    keep them; SWE-bench rows get the issue as the prompt and the workspace tools; plain rows
    (`input_key`/`output_key`, NeMo RL ResponseDataset style) are mapped."""
    row = dict(raw)
    if "responses_create_params" not in row and is_swe_bench_row(row):
        row["responses_create_params"] = swe_bench_prompt(row)
    if "responses_create_params" not in row and spec.input_key in row:
        content = row.pop(spec.input_key)
        if isinstance(content, list):
            messages = [dict(m) for m in content]
        else:
            text = str(content)
            if template:
                text = template.replace("{input}", text) if "{input}" in template else template.format(text)
            messages = [{"role": "user", "content": text}]
        row["responses_create_params"] = {"input": messages}
        if spec.output_key in row:
            row[spec.answer_field] = row.pop(spec.output_key)
    params = row.get("responses_create_params")
    if system_prompt and isinstance(params, dict):
        messages = params.get("input")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        if isinstance(messages, list) and not (messages and isinstance(messages[0], dict)
                                               and messages[0].get("role") in ("system", "developer")):
            params["input"] = [{"role": "system", "content": system_prompt}, *messages]
    if spec.agent:
        row["agent_ref"] = {"type": "responses_api_agents", "name": spec.agent}
    if spec.task_name:
        row["task_name"] = spec.task_name
    return row


@dataclass
class DatasetStats:
    label: str
    source: str
    weight: float
    agent: str | None
    env: str | None
    rows_read: int = 0
    rows_valid: int = 0
    rows_invalid: int = 0
    train_rows_available: int = 0
    validation_rows: int = 0
    train_rows: int = 0
    mean_prompt_chars: float = 0.0


def prepare_dataset(spec: DatasetSpec, *, skip_invalid: bool) -> tuple[list[dict[str, Any]], DatasetStats, list[str]]:
    system_prompt = spec.system_prompt if spec.system_prompt is not None else _read_text(spec.system_prompt_file)
    template = _read_text(spec.prompt_file)
    raw = load_source(spec)
    if spec.max_rows is not None:
        raw = raw[: spec.max_rows]
    stats = DatasetStats(spec.label, spec.source, spec.weight, spec.agent, None, rows_read=len(raw))
    rows, errors = [], []
    for where, item in raw:
        row = to_gym_row(item, spec, system_prompt=system_prompt, template=template)
        agent_ref = row.get("agent_ref")
        env = spec.env or env_of_agent(agent_ref.get("name") if isinstance(agent_ref, dict) else None)
        stats.env = stats.env or env
        problems = row_problems(row, env, spec.require)
        if problems:
            errors.extend(f"{where}: {p}" for p in problems)
            stats.rows_invalid += 1
            continue
        rows.append(row)
    stats.rows_valid = len(rows)
    if rows:
        stats.mean_prompt_chars = round(sum(len(json.dumps(r["responses_create_params"].get("input"), ensure_ascii=False))
                                            for r in rows) / len(rows), 1)
    if errors and not skip_invalid:
        raise PrepareError(f"{len(errors)} problem(s) in {spec.source}:\n" + "\n".join(errors[:100])
                           + (f"\n... and {len(errors) - 100} more" if len(errors) > 100 else ""))
    return rows, stats, errors


def split_validation(rows: list[dict[str, Any]], ratio: float, rng: random.Random) -> tuple[list, list]:
    if not 0.0 <= ratio < 1.0:
        raise PrepareError(f"validation_ratio must be in [0, 1), got {ratio}")
    order = list(range(len(rows)))
    rng.shuffle(order)
    n_val = int(round(len(rows) * ratio))
    if ratio > 0 and n_val == 0 and len(rows) > 1:
        n_val = 1
    val_idx = set(order[:n_val])
    return [r for i, r in enumerate(rows) if i not in val_idx], [rows[i] for i in sorted(val_idx)]


def blend(parts: list[list[dict[str, Any]]], weights: list[float], total: int | None,
          rng: random.Random) -> list[list[dict[str, Any]]]:
    """Rows taken from each part in proportion to its weight (upsampling by repetition when a part
    is too small); `total` defaults to the sum of the parts' sizes."""
    if any(w < 0 or not math.isfinite(w) for w in weights) or sum(weights) <= 0:
        raise PrepareError(f"weights must be non-negative with a positive sum, got {weights}")
    total = sum(len(p) for p in parts) if total is None else total
    norm = [w / sum(weights) for w in weights]
    counts = [int(math.floor(total * w)) for w in norm]
    # hand out the remainder by largest fractional part (deterministic)
    for i in sorted(range(len(parts)), key=lambda i: -(total * norm[i] - counts[i]))[: total - sum(counts)]:
        counts[i] += 1
    taken = []
    for part, count in zip(parts, counts):
        if count and not part:
            raise PrepareError("a dataset with a positive weight has no valid training rows")
        picked: list[dict[str, Any]] = []
        while len(picked) < count:
            order = list(range(len(part)))
            rng.shuffle(order)
            picked.extend(part[i] for i in order[: count - len(picked)])
        taken.append(picked)
    return taken


def prepare(options: PrepareOptions) -> dict[str, Any]:
    """Run the whole preparation; returns the stats written to `stats.json`."""
    if not options.datasets:
        raise PrepareError("no datasets given")
    rng = random.Random(options.seed)
    trains, vals, all_stats, skipped = [], [], [], []
    for spec in options.datasets:
        rows, stats, errors = prepare_dataset(spec, skip_invalid=options.skip_invalid)
        skipped.extend(errors)
        train, val = split_validation(rows, options.validation_ratio, rng)
        stats.train_rows_available, stats.validation_rows = len(train), len(val)
        trains.append(train)
        vals.append(val)
        all_stats.append(stats)
    picked = blend(trains, [s.weight for s in options.datasets], options.num_rows, rng)
    train_rows = []
    for stats, rows in zip(all_stats, picked):
        stats.train_rows = len(rows)
        train_rows.extend(rows)
    rng.shuffle(train_rows)
    validation_rows = [row for part in vals for row in part]
    out = Path(options.output_dir)
    write_jsonl(out / "train.jsonl", train_rows)
    write_jsonl(out / "validation.jsonl", validation_rows)
    result = {"train_rows": len(train_rows), "validation_rows": len(validation_rows), "seed": options.seed,
              "validation_ratio": options.validation_ratio, "skipped_invalid": len(skipped),
              "datasets": [asdict(s) for s in all_stats]}
    (out / "stats.json").write_text(json.dumps(result, indent=2))
    if skipped:
        (out / "skipped.txt").write_text("\n".join(skipped) + "\n")
    return result


def load_options(path: str | Path, overrides: dict[str, Any] | None = None) -> PrepareOptions:
    """A YAML/JSON file: output_dir, validation_ratio, seed, num_rows, skip_invalid, datasets: [spec...]."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise PrepareError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("datasets"), list):
        raise PrepareError(f"{path}: expected a mapping with a `datasets` list")
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    known = set(DatasetSpec.__dataclass_fields__)
    specs = []
    for i, item in enumerate(data.pop("datasets")):
        if isinstance(item, str):
            item = {"source": item}
        unknown = set(item) - known if isinstance(item, dict) else set()
        if not isinstance(item, dict) or "source" not in item or unknown:
            raise PrepareError(f"{path}: datasets[{i}]: expected {{source, ...}} with keys from {sorted(known)}"
                               + (f"; unknown: {sorted(unknown)}" if unknown else ""))
        specs.append(DatasetSpec(**item))
    unknown = set(data) - set(PrepareOptions.__dataclass_fields__)
    if unknown:
        raise PrepareError(f"{path}: unknown keys {sorted(unknown)}")
    if "output_dir" not in data:
        raise PrepareError(f"{path}: output_dir is required (or pass -o)")
    return PrepareOptions(datasets=specs, **data)


def reasoning_gym_rows(task: str, size: int, seed: int, agent: str | None = None) -> list[dict[str, Any]]:
    """Rows generated by the reasoning_gym environment's generator (imported only when used)."""
    from services.resources.reasoning_gym.generate import generate_rows

    kwargs = {"agent_name": agent} if agent else {}
    try:
        return generate_rows(task, size, seed, **kwargs)
    except ValueError as exc:
        raise PrepareError(str(exc)) from None
