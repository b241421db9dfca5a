"""TRL 1.16 integration: a `rollout_func` for GRPOTrainer that runs every prompt as a
gymserve rollout (agent `/run` through the head), plus reward functions.

How prompts map back to dataset rows: the training dataset has a `prompt` column (the
row's `responses_create_params.input` messages) and a `gymserve_row` column (the whole row
as JSON). The rollout function indexes the trainer's datasets by canonical prompt JSON on
first use (or takes `rows=` explicitly), so each prompt TRL hands it finds its row, its
`agent_ref` and its task fields.

What the rollout function returns per prompt (TRL already repeated each prompt
`num_generations` times): `prompt_ids` (the first model call's prompt as the server saw it),
`completion_ids`/`logprobs`/`env_mask` stitched over all model calls (tokens between calls
have mask 0), and extra fields for the reward functions: `env_reward`, `reward_<name>` per
component, `num_turns`, `gymserve_failure`.

Failed rollouts are masked, not rewarded 0: completion = one EOS token with env_mask 0 (no
token enters the loss) and every reward is None, which TRL turns into NaN, excludes from the
group baseline and gives advantage 0.
"""
from __future__ import annotations

import copy
import json
import logging
from collections import defaultdict
from typing import Any, Callable, Iterable

from services.core.content import content_text
from services.core.failures import FailureKind

from .client import RolloutClient, background_loop, cut_by_batch_deadline, is_failure, run_sync
from .rollout_queue import RolloutQueue
from .tokens import StitchError, stitch

log = logging.getLogger("gymserve.trainer.trl")
ROW_COLUMN = "gymserve_row"


def prompt_key(prompt: Any) -> str:
    if isinstance(prompt, str):
        return json.dumps([{"role": "user", "content": prompt}], sort_keys=True)
    return json.dumps([{k: v for k, v in m.items() if v is not None} for m in prompt], sort_keys=True, default=str)


def batch_key(prompts: list[Any]) -> str:
    """Identifies a batch by its prompts, in order (how a prefetched batch is found again)."""
    return json.dumps([prompt_key(p) for p in prompts])


def row_prompt(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a row (what goes in the dataset's `prompt` column)."""
    params = row.get("responses_create_params") or {}
    messages = params.get("input") or []
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if params.get("instructions"):
        messages = [{"role": "system", "content": params["instructions"]}, *messages]
    return [{"role": m.get("role", "user"), "content": content_text(m.get("content"))} for m in messages
            if isinstance(m, dict) and "role" in m]


def to_trl_dataset(rows: Iterable[dict[str, Any]]):
    """A `datasets.Dataset` with `prompt` and `gymserve_row` columns for GRPOTrainer."""
    import datasets

    items = [{"prompt": row_prompt(row), ROW_COLUMN: json.dumps(row, ensure_ascii=False)} for row in rows]
    return datasets.Dataset.from_list(items)


class RowIndex:
    """Prompt -> dataset row."""

    def __init__(self, rows: Iterable[dict[str, Any]] = ()) -> None:
        self._rows: dict[str, dict[str, Any]] = {}
        self.add(rows)

    def add(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self._rows.setdefault(prompt_key(row_prompt(row)), row)

    def add_dataset(self, dataset: Any) -> None:
        if dataset is None:
            return
        if isinstance(dataset, dict):  # several eval datasets
            for part in dataset.values():
                self.add_dataset(part)
            return
        if ROW_COLUMN not in getattr(dataset, "column_names", []):
            return
        self.add(json.loads(text) for text in dataset[ROW_COLUMN])

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, prompt: Any) -> dict[str, Any] | None:
        return self._rows.get(prompt_key(prompt))


def make_rollout_func(head_url: str | None, tokenizer: Any, *, rows: Iterable[dict[str, Any]] | None = None,
                      agents: dict[str, str] | None = None, concurrency: int = 64, deadline_s: float = 900.0,
                      retries: int = 2, batch_deadline_s: float | None = None, sampling: dict[str, Any] | None = None,
                      on_records: Callable[[list[dict[str, Any]]], None] | None = None,
                      before_batch: Callable[[Any], None] | None = None,
                      after_batch: Callable[[Any, list[dict[str, Any]]], None] | None = None,
                      max_policy_lag: int = 0, is_stale: Callable[[Any, dict[str, Any]], bool] | None = None,
                      on_stats: Callable[[Any, dict[str, float]], None] | None = None,
                      ) -> Callable[[list[Any], Any], dict[str, list[Any]]]:
    """Build `rollout_func(prompts, trainer) -> dict` for trl.GRPOTrainer.

    `sampling` overrides `responses_create_params` fields of every row (e.g. temperature);
    otherwise rows without `max_output_tokens`/`temperature` get the trainer's
    `max_completion_length`/`temperature`. `on_records` sees the raw rollout records.
    `before_batch(trainer)` runs before any rollout of a batch starts (weight sync) and
    `after_batch(trainer, records)` after all finished (policy lag metrics).
    `batch_deadline_s`: rollouts of a batch still running that long after it started are
    cancelled and masked as `timeout` (a straggler does not hold the step); the count is in
    `rollout_func.stats["cut_by_batch_deadline"]`.

    `max_policy_lag >= 1` turns on asynchronous rollouts (trainer/rollout_queue.py):
    `rollout_func.prefetch(batch, trainer)` runs `before_batch` (the weights of the step just
    finished are pushed) and starts an upcoming batch's rollouts, up to `max_policy_lag`
    batches ahead of the one being trained (`rollout_func.read_ahead`); a prefetched sample
    for which `is_stale(trainer, record)` holds is rolled out again. `on_stats(trainer, counts)`
    gets per-batch `stale_dropped` and `prefetch_hit`.
    """
    client = RolloutClient(head_url, agents=agents, concurrency=concurrency, deadline_s=deadline_s, retries=retries)
    index = RowIndex(rows or ())
    state: dict[str, Any] = {"indexed_trainer": False, "batch": 0, "last_prefetched": None}
    stats = {"cut_by_batch_deadline": 0}
    queue = None
    if max_policy_lag >= 1:
        # the batch about to be trained is still queued when the k batches after it are read ahead
        queue = RolloutQueue(lambda todo_rows: client.run_many(todo_rows, batch_deadline_s=batch_deadline_s),
                             background_loop().loop, max_pending=max_policy_lag + 1)

    def index_trainer(trainer: Any) -> None:
        if not state["indexed_trainer"] and trainer is not None:
            index.add_dataset(getattr(trainer, "train_dataset", None))
            index.add_dataset(getattr(trainer, "eval_dataset", None))
            state["indexed_trainer"] = True

    def run_rows(todo_rows: list[dict[str, Any]], group_rewards: bool = True) -> list[dict[str, Any]]:
        return run_sync(lambda: client.run_many(todo_rows, batch_deadline_s=batch_deadline_s,
                                                group_rewards=group_rewards))

    def prefetch(batch: list[dict[str, Any]], trainer: Any) -> bool:
        """Start the rollouts of an upcoming dataloader batch (items with a `prompt`)."""
        if queue is None:
            return False
        index_trainer(trainer)
        prompts = [item["prompt"] for item in batch]
        key = batch_key(prompts)
        if key == state["last_prefetched"]:  # TRL repeats a batch for num_iterations > 1
            return False
        work, _ = _build_rows(prompts, index, trainer, sampling, state["batch"] + len(queue))
        todo_rows = [row for row in work if row is not None]
        if not todo_rows:
            return False
        if before_batch is not None:  # the weights of the step just finished, before sampling ahead
            before_batch(trainer)
        if not queue.submit(key, todo_rows):
            return False
        state["last_prefetched"] = key
        return True

    def collect(prompts: list[Any], todo: list[tuple[int, dict[str, Any]]], trainer: Any) -> list[dict[str, Any]]:
        """The batch's records: prefetched ones (stale samples rolled out again), else collected now."""
        results = queue.take(batch_key(prompts)) if queue is not None else None
        if queue is None or results is None or len(results) != len(todo):
            results = run_rows([row for _, row in todo])
            if queue is not None and on_stats is not None:
                on_stats(trainer, {"prefetch_hit": 0.0, "stale_dropped": 0.0})
            return results
        stale = [k for k, record in enumerate(results) if is_stale is not None and is_stale(trainer, record)]
        if stale:
            for k, record in zip(stale, run_rows([todo[k][1] for k in stale], group_rewards=False)):
                results[k] = record
            # a group reward compares the group's samples: score their groups again, with the new ones
            rows_now, scored = [row for _, row in todo], results
            results = run_sync(lambda: client.rescore(rows_now, scored, stale))
        if on_stats is not None:
            on_stats(trainer, {"prefetch_hit": 1.0, "stale_dropped": float(len(stale))})
        return results

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        index_trainer(trainer)
        if before_batch is not None:
            before_batch(trainer)
        work, missing = _build_rows(prompts, index, trainer, sampling, state["batch"])
        state["batch"] += 1
        todo = [(i, row) for i, row in enumerate(work) if row is not None]
        records: list[dict[str, Any] | None] = [None] * len(prompts)
        if todo:
            results = collect(prompts, todo, trainer)
            for (i, _), record in zip(todo, results):
                records[i] = record
            stats["cut_by_batch_deadline"] += sum(cut_by_batch_deadline(r) for r in results)
        for i in missing:
            records[i] = {"reward": None, "mask_sample": True, "failure_kind": str(FailureKind.BAD_REQUEST),
                          "failure_reason": "prompt not found in the training data (no gymserve_row for it)"}
        finished = [r for r in records if r is not None]
        if on_records is not None:
            on_records(finished)
        if after_batch is not None:
            after_batch(trainer, finished)
        return rollout_outputs(prompts, records, tokenizer)

    rollout_func.client = client  # type: ignore[attr-defined]
    rollout_func.stats = stats  # type: ignore[attr-defined]
    rollout_func.index = index  # type: ignore[attr-defined]
    rollout_func.queue = queue  # type: ignore[attr-defined]
    rollout_func.prefetch = prefetch  # type: ignore[attr-defined]
    rollout_func.read_ahead = max_policy_lag if queue is not None else 0  # type: ignore[attr-defined]
    rollout_func.queue = queue  # type: ignore[attr-defined]
    rollout_func.prefetch = prefetch  # type: ignore[attr-defined]
    rollout_func.read_ahead = max_policy_lag if queue is not None else 0  # type: ignore[attr-defined]
    return rollout_func


def _build_rows(prompts: list[Any], index: RowIndex, trainer: Any, sampling: dict[str, Any] | None,
                batch: int) -> tuple[list[dict[str, Any] | None], list[int]]:
    args = getattr(trainer, "args", None)
    defaults = {}
    if args is not None:
        if getattr(args, "max_completion_length", None):
            defaults["max_output_tokens"] = int(args.max_completion_length)
        if getattr(args, "temperature", None) is not None:
            defaults["temperature"] = float(args.temperature)
    seen: dict[str, int] = defaultdict(int)
    task_of: dict[str, int] = {}
    out: list[dict[str, Any] | None] = []
    missing = []
    for i, prompt in enumerate(prompts):
        row = index.get(prompt)
        if row is None:
            log.warning("prompt %d of the batch is not in the indexed training data; it is masked", i)
            out.append(None)
            missing.append(i)
            continue
        key = prompt_key(prompt)
        task_of.setdefault(key, len(task_of))
        row = copy.deepcopy(row)
        params = row.setdefault("responses_create_params", {})
        for name, value in defaults.items():
            params.setdefault(name, value)
        params.update(sampling or {})
        row["_ng_task_index"] = task_of[key]
        row["_ng_rollout_index"] = seen[key]
        row["_gymserve_batch"] = batch
        seen[key] += 1
        out.append(row)
    return out, missing


def _fallback_prompt_ids(prompt: Any, tokenizer: Any) -> list[int]:
    try:
        if isinstance(prompt, str):
            return list(tokenizer(prompt, add_special_tokens=False)["input_ids"]) or [_eos(tokenizer)]
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids] or [_eos(tokenizer)]
    except Exception:  # a failed rollout must not stop training: any prompt ids will do, it is masked
        return [_eos(tokenizer)]


def _eos(tokenizer: Any) -> int:
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, list):
        eos = eos[0]
    return int(eos if eos is not None else (getattr(tokenizer, "pad_token_id", None) or 0))


def rollout_outputs(prompts: list[Any], records: list[dict[str, Any] | None], tokenizer: Any
                    ) -> dict[str, list[Any]]:
    """TRL's rollout dict from rollout records (one per prompt, in order)."""
    out: dict[str, list[Any]] = defaultdict(list)
    component_names = sorted({name for r in records if r and not is_failure(r)
                              for name in (r.get("reward_components") or {})})
    for prompt, record in zip(prompts, records):
        record = record or {"mask_sample": True, "failure_kind": str(FailureKind.UPSTREAM), "failure_reason": "no result"}
        failure = None
        if is_failure(record):
            failure = str(record.get("failure_kind") or FailureKind.UPSTREAM)
        else:
            try:
                tokens = stitch(record.get("response") or {})
            except StitchError as exc:
                failure = str(FailureKind.UPSTREAM)
                record = {**record, "failure_reason": str(exc)}
                log.warning("rollout masked: %s", exc)
        if failure is None:
            out["prompt_ids"].append(tokens.prompt_ids)
            out["completion_ids"].append(tokens.completion_ids)
            out["logprobs"].append(tokens.logprobs)
            out["env_mask"].append(tokens.env_mask)
            out["env_reward"].append(float(record["reward"]))
            comps = record.get("reward_components") or {}
            for name in component_names:
                out[f"reward_{name}"].append(float(comps[name]) if name in comps else None)
            out["num_turns"].append(int(record.get("num_turns") or tokens.num_calls))
        else:
            out["prompt_ids"].append(_fallback_prompt_ids(prompt, tokenizer))
            out["completion_ids"].append([_eos(tokenizer)])
            out["logprobs"].append([0.0])
            out["env_mask"].append([0])
            out["env_reward"].append(None)
            for name in component_names:
                out[f"reward_{name}"].append(None)
            out["num_turns"].append(0)
        out["gymserve_failure"].append(failure)
        out["gymserve_failure_reason"].append(record.get("failure_reason") if failure else None)
    return dict(out)


def env_reward(completions: list[Any], env_reward: list[float | None] | None = None, **_: Any) -> list[float | None]:
    """The environment's total reward (None for a masked rollout)."""
    if env_reward is None:
        raise ValueError("env_reward missing: use gymserve's rollout_func (trainer.trl.make_rollout_func)")
    return list(env_reward)


def component_reward(name: str) -> Callable[..., list[float | None]]:
    """A reward function for one reward component (`reward_<name>` extra field); None where absent."""
    key = f"reward_{name}"

    def reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
        values = kwargs.get(key)
        if values is None:
            return [None] * len(completions)
        return list(values)

    reward.__name__ = key
    reward.__qualname__ = key
    return reward


def reward_functions(components: Iterable[str] | None = None, *, include_total: bool | None = None
                     ) -> list[Callable[..., list[float | None]]]:
    """Reward functions for GRPOTrainer: the total (GRPO), or one per component (GDPO with
    `multi_objective_aggregation="normalize_then_sum"`), or both when `include_total=True`."""
    components = list(components or [])
    funcs = [component_reward(name) for name in components]
    if include_total or (include_total is None and not components):
        funcs.insert(0, env_reward)
    return funcs
