"""Per-step training records: one function, `StepLog.record`, sees every record.

It appends the record to `metrics.jsonl`, posts it to the head's dashboard (non-blocking,
see training_feed.py) and advances the progress bar (live reward, |Δlogp|, policy lag).
Anything else that wants each step (a tracker) is one call added in `record`. `plot` turns
the file into `reward.png` at the end of a run.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

REWARD = "reward"
KL = "kl"
LOGP_DELTA_MEAN = "policy/logp_delta_mean"
LOGP_DELTA_MAX = "policy/logp_delta_max"
POLICY_LAG = "policy/lag_max"
ENV_REWARD_PREFIX = "reward/"  # reward/<agent>: one series per environment
EVAL_REWARD = "eval_reward"  # TRL prefixes evaluation metrics with eval_


def json_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


class StepLog:
    """Writes `metrics.jsonl` in `output_dir` and shows a rich progress bar of `total` steps."""

    def __init__(self, output_dir: str | Path, total: int | None = None, *, progress: bool = True,
                 head_url: str | None = None, run: str | None = None) -> None:
        self.path = Path(output_dir) / "metrics.jsonl"
        self.head_url = head_url  # the dashboard's training charts (None: metrics.jsonl only)
        self.run = run or Path(output_dir).name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        self.total = total
        self._progress: Any = None
        self._task: Any = None
        if progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TextColumn("{task.description}"), transient=False)

    def start(self) -> None:
        if self._progress is not None and self._task is None:
            self._progress.start()
            self._task = self._progress.add_task("waiting for the first rollouts", total=self.total)

    def stop(self) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.stop()
            self._task = None

    def record(self, step: int, logs: dict[str, Any]) -> dict[str, Any]:
        """The one place each per-step record goes through: metrics.jsonl, then the progress bar."""
        record = {"step": step, **{k: json_value(v) for k, v in logs.items()}}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.head_url:
            from .training_feed import report_step

            report_step(record, head_url=self.head_url, run=self.run)
        if self._progress is not None and self._task is not None and REWARD in record:
            self._progress.update(self._task, completed=step, description=describe(record))
        return record


def describe(record: dict[str, Any]) -> str:
    parts = [f"reward {record[REWARD]:.3f}" if isinstance(record.get(REWARD), (int, float)) else "reward -"]
    for key, label in ((LOGP_DELTA_MEAN, "|Δlogp|"), (KL, "kl"), (POLICY_LAG, "lag")):
        value = record.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{label} {value:.3g}")
    return "  ".join(parts)


def read_metrics(path: str | Path, key: str = REWARD) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl with a number under `key`: training steps (reward) by default,
    evaluations with `key=EVAL_REWARD`."""
    lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [line for line in lines if isinstance(line.get(key), (int, float))]


def plot(metrics_path: str | Path, out_path: str | Path) -> Path:
    """`reward.png`: reward (± std, per environment, eval), reward components, KL and the mismatch per step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    steps = [r["step"] for r in rows]
    evals = read_metrics(metrics_path, key=EVAL_REWARD)

    def series(key: str) -> list[float]:
        return [float(r[key]) if isinstance(r.get(key), (int, float)) else math.nan for r in rows]

    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    ax = axes[0][0]
    reward, std = series(REWARD), series("reward_std")
    ax.plot(steps, reward, marker="o", label="mean reward")
    ax.fill_between(steps, [m - s for m, s in zip(reward, std)], [m + s for m, s in zip(reward, std)], alpha=0.2)
    for key in sorted({k for r in rows for k in r if k.startswith(ENV_REWARD_PREFIX)}):
        ax.plot(steps, series(key), marker=".", label=key)  # one curve per environment (trainer/grpo.py)
    if evals:
        ax.plot([r["step"] for r in evals], [float(r[EVAL_REWARD]) for r in evals], marker="s", linestyle="--",
                label="eval reward")
    ax.set_title("reward")
    ax.legend(fontsize=8)
    ax.set_ylim(-0.05, 1.05) if all(0 <= r <= 1 for r in reward if r == r) else None
    ax = axes[0][1]
    components = sorted({k for r in rows for k in r if k.startswith("rewards/") and k.endswith("/mean")})
    for key in components:
        ax.plot(steps, series(key), marker=".", label=key[len("rewards/"):-len("/mean")])
    ax.set_title("reward components")
    if components:
        ax.legend(fontsize=8)
    ax = axes[1][0]
    ax.plot(steps, series(KL), marker=".", color="tab:red")
    ax.set_title("KL to the reference model")
    ax.set_xlabel("step")
    ax = axes[1][1]
    ax.plot(steps, series(LOGP_DELTA_MEAN), marker=".", label="|Δlogp| mean")
    ax.plot(steps, series(LOGP_DELTA_MAX), marker=".", label="|Δlogp| max")
    for key in ("gen_kl_error", "policy_kl_error", "js_divergence_error"):
        if any(isinstance(r.get(key), (int, float)) for r in rows):
            ax.plot(steps, series(key), marker=".", label=key)
    ax.set_yscale("symlog", linthresh=1e-6)
    ax.set_title("sampler vs trainer mismatch")
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    for row in axes:
        for a in row:
            a.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out_path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
