"""A one-file HTML report of a run, readable without a server: per environment (agent) the
reward histogram, mean reward and masked failures by kind; with training records, the
reward and KL curves by step.

The file is self-contained (inline SVG and CSS, no script, no fetches) so it can be
mailed, attached to a ticket or opened on a machine with no network. The histogram uses
the same bins as the head's live `gymserve_reward` histogram.
"""
from __future__ import annotations

import html
import json
import math
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

from services.core.metrics import Bin, reward_bins

from .client import agent_name, is_failure
from .step_log import ENV_REWARD_PREFIX, EVAL_REWARD

_W, _H = 440, 190  # chart size in px
_PAD_L, _PAD_B, _PAD_T, _PAD_R = 46, 34, 16, 10
_BLUE, _RED, _PINK = "#0969da", "#cf222e", "#bf3989"
_CHAR_PX, _LABEL_GAP_PX = 6.0, 6.0  # the 10 px tick font's widest digits, and the space between two labels
_PALETTE = (_BLUE, "#1a7f37", "#9a6700", _PINK, "#8250df", _RED)
# metrics.jsonl keys: per-environment reward (trainer/grpo.py), TRL's reward components, mismatch metrics
_COMPONENT_PREFIX = "rewards/"
_MISMATCH = ("gen_kl_error", "policy_kl_error", "js_divergence_error")


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _num(value: float | None) -> str:
    if value is None:
        return "&ndash;"
    return f"{value:.4g}"


def _bin_label(b: Bin, first: bool = False) -> str:
    """The first bin drawn holds every reward at or below its upper edge (empty bins below are left
    out), so rewards of 0 read "&le;0", not "-0.25&ndash;0"."""
    if b["lo"] is None or first:
        return f"&le;{b['hi']:g}"
    if b["hi"] is None:
        return f"&gt;{b['lo']:g}"
    return f"{b['lo']:g}&ndash;{b['hi']:g}"


def bar_chart(labels: Sequence[str], counts: Sequence[int], *, color: str = _BLUE, title: str = "") -> str:
    """An inline SVG bar chart; `labels` are already HTML-escaped."""
    if not counts:
        return '<p class="empty">nothing to draw</p>'
    top = max(max(counts), 1)
    plot_w, plot_h = _W - _PAD_L - _PAD_R, _H - _PAD_T - _PAD_B
    slot = plot_w / len(counts)
    # every k-th label, k chosen so that labels (about 6 px a character at the tick font) keep a gap
    widest = max(len(html.unescape(label)) for label in labels) * _CHAR_PX + _LABEL_GAP_PX
    every = max(1, math.ceil(widest / slot))
    parts = [f'<svg class="chart" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" role="img" '
             f'aria-label="{_esc(title)}">']
    for frac in (0, 0.5, 1):
        y = _PAD_T + plot_h * (1 - frac)
        parts.append(f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                     f'<text x="{_PAD_L - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{top * frac:g}</text>')
    for i, (label, count) in enumerate(zip(labels, counts)):
        h = plot_h * count / top
        bar_w = min(slot * 0.84, 56.0)
        center = _PAD_L + (i + 0.5) * slot
        y = _PAD_T + plot_h - h
        parts.append(f'<rect x="{center - bar_w / 2:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                     f'fill="{color}"><title>{label}: {count}</title></rect>')
        if count:
            parts.append(f'<text x="{center:.1f}" y="{y - 3:.1f}" class="val" text-anchor="middle">{count}</text>')
        if i % every == 0:
            parts.append(f'<text x="{center:.1f}" y="{_H - _PAD_B + 14}" class="tick" '
                         f'text-anchor="middle">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)


def line_chart(xs: Sequence[float], series: dict[str, tuple[Sequence[float | None], str]], *, title: str = "") -> str:
    """An inline SVG line chart of `{name: (ys, color)}` over `xs` (None leaves a gap)."""
    values = [y for ys, _ in series.values() for y in ys if y is not None]
    if not xs or not values:
        return '<p class="empty">nothing to draw</p>'
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(values), max(values)
    if y0 == y1:
        y0, y1 = y0 - 0.5, y1 + 0.5
    plot_w, plot_h = _W - _PAD_L - _PAD_R, _H - _PAD_T - _PAD_B

    def px(x: float) -> float:
        return _PAD_L + (plot_w * (x - x0) / (x1 - x0) if x1 > x0 else plot_w / 2)

    def py(y: float) -> float:
        return _PAD_T + plot_h * (1 - (y - y0) / (y1 - y0))

    parts = [f'<svg class="chart" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" role="img" '
             f'aria-label="{_esc(title)}">']
    for tick in (y0, (y0 + y1) / 2, y1):
        parts.append(f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{py(tick):.1f}" y2="{py(tick):.1f}" class="grid"/>'
                     f'<text x="{_PAD_L - 6}" y="{py(tick) + 4:.1f}" class="tick" text-anchor="end">{tick:.3g}</text>')
    for x in sorted({x0, x1}):
        parts.append(f'<text x="{px(x):.1f}" y="{_H - _PAD_B + 14}" class="tick" text-anchor="middle">{x:g}</text>')
    parts.append(f'<text x="{_PAD_L + plot_w / 2:.1f}" y="{_H - 4}" class="tick" text-anchor="middle">step</text>')
    for legend_i, (name, (ys, color)) in enumerate(series.items()):
        runs: list[list[str]] = [[]]
        for x, y in zip(xs, ys):
            if y is None:
                runs.append([])
            else:
                runs[-1].append(f"{px(x):.1f},{py(y):.1f}")
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}"/>')
            elif run:
                parts.append(f'<polyline points="{" ".join(run)}" fill="none" stroke="{color}" stroke-width="2"/>')
        parts.append(f'<text x="{_PAD_L + 8 + 110 * legend_i}" y="{_PAD_T - 4}" class="legend" fill="{color}">'
                     f'&#9632; {_esc(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per environment (agent name): judged rewards, masked count and failures by kind."""
    groups: dict[str, dict[str, Any]] = defaultdict(lambda: {"rewards": [], "failures": Counter()})
    for record in records:
        group = groups[agent_name(record) or "<no agent_ref>"]
        if is_failure(record):
            group["failures"][str(record.get("failure_kind") or "unknown")] += 1
        else:
            group["rewards"].append(float(record["reward"]))
    out = {}
    for name, g in sorted(groups.items()):
        rewards: list[float] = g["rewards"]
        out[name] = {"rollouts": len(rewards) + sum(g["failures"].values()), "judged": len(rewards),
                     "masked": sum(g["failures"].values()), "failures": dict(sorted(g["failures"].items())),
                     "reward_mean": statistics.fmean(rewards) if rewards else None,
                     "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else None,
                     "bins": reward_bins(rewards)}
    return out


def _training_section(training: list[dict[str, Any]]) -> str:
    by_step: dict[float, dict[str, Any]] = {}  # a step's training and evaluation records are separate lines
    for r in training:
        if isinstance(r.get("step"), (int, float)):
            by_step.setdefault(r["step"], {}).update(r)
    steps = [by_step[k] for k in sorted(by_step)]
    if not steps:
        return ""
    xs = [float(r["step"]) for r in steps]

    def column(key: str) -> list[float | None]:
        out = []
        for r in steps:
            v = r.get(key)
            out.append(float(v) if isinstance(v, (int, float)) and math.isfinite(v) else None)
        return out

    def card(title: str, keys: dict[str, str]) -> str:
        series = {label: (column(key), _PALETTE[i % len(_PALETTE)]) for i, (label, key) in enumerate(keys.items())}
        return f'<div class="card"><h3>{_esc(title)}</h3>{line_chart(xs, series, title=title)}</div>'

    keys = sorted({k for r in steps for k in r if isinstance(k, str)})
    reward_keys = {"reward": "reward"}
    if any(v is not None for v in column(EVAL_REWARD)):
        reward_keys["eval reward"] = EVAL_REWARD
    charts = [card("reward by step", reward_keys)]
    envs = {k[len(ENV_REWARD_PREFIX):]: k for k in keys if k.startswith(ENV_REWARD_PREFIX)}
    if envs:
        charts.append(card("reward by environment", envs))
    components = {k[len(_COMPONENT_PREFIX):-len("/mean")]: k for k in keys
                  if k.startswith(_COMPONENT_PREFIX) and k.endswith("/mean")}
    if len(components) > 1:
        charts.append(card("reward components", components))
    if any(v is not None for v in column("kl")):
        charts.append(card("KL by step", {"kl": "kl"}))
    mismatch = {k: k for k in _MISMATCH if k in keys}
    if mismatch:
        charts.append(card("sampler/trainer mismatch", mismatch))
    return f'<h2>Training</h2><div class="grid" id="training">{"".join(charts)}</div>'


_CSS = """body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif;margin:1.5em;color:#1f2328}
h1{font-size:1.4em;margin:0 0 .2em}h2{font-size:1.1em;margin:1.2em 0 .5em}h3{font-size:1em;margin:0 0 .4em}
.muted,.empty{color:#59636e}.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(470px,1fr));gap:12px}
.card{border:1px solid #d1d9e0;border-radius:8px;padding:.7em .9em}
.stats{display:flex;gap:1.2em;flex-wrap:wrap;margin-bottom:.4em}.stats b{display:block;font-size:1.25em}
.stats span{color:#59636e;font-size:.85em}table{border-collapse:collapse;margin-top:.4em}
th,td{padding:.25em .7em;border-bottom:1px solid #d1d9e0;text-align:left}td.n{text-align:right}
svg .grid{stroke:#eaeef2}svg .tick{font-size:10px;fill:#59636e}svg .val{font-size:10px;fill:#1f2328}
svg .legend{font-size:11px}"""


def render_report(records: list[dict[str, Any]], *, title: str = "gymserve run",
                  training: list[dict[str, Any]] | None = None) -> str:
    """The report as one HTML string (see the module docstring)."""
    summary = summarize(records)
    cards = []
    for name, s in summary.items():
        failures = "".join(f"<tr><td>{_esc(k)}</td><td class=\"n\">{n}</td></tr>" for k, n in s["failures"].items())
        chart = bar_chart([_bin_label(b, i == 0) for i, b in enumerate(s["bins"])], [int(b["count"]) for b in s["bins"]],
                          title=f"reward histogram of {name}") if s["bins"] else '<p class="empty">no judged rollouts</p>'
        cards.append(
            f'<div class="card env" data-env="{_esc(name)}"><h3>{_esc(name)}</h3><div class="stats">'
            f'<div><b data-field="judged">{s["judged"]}</b><span>judged</span></div>'
            f'<div><b data-field="reward_mean">{_num(s["reward_mean"])}</b><span>mean reward</span></div>'
            f'<div><b>{_num(s["reward_std"])}</b><span>std</span></div>'
            f'<div><b data-field="masked">{s["masked"]}</b><span>masked</span></div></div>'
            f'<div class="muted">reward histogram (judged rollouts)</div>{chart}'
            f'<div class="muted">masked failures by kind</div>'
            + (f'<table class="failures"><tr><th>kind</th><th>count</th></tr>{failures}</table>' if failures
               else '<p class="empty">none</p>') + "</div>")
    total = sum(s["rollouts"] for s in summary.values())
    masked = sum(s["masked"] for s in summary.values())
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title><style>{_CSS}</style></head><body>
<h1>{_esc(title)}</h1>
<p class="muted">{total} rollouts, {masked} masked as infrastructure failures (not scored as 0) &middot;
written {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by gymserve</p>
{_training_section(training or [])}
<h2>Rewards by environment</h2>
<div class="grid">{''.join(cards) or '<p class="empty">no rollouts</p>'}</div>
</body></html>
"""


def write_report(records: list[dict[str, Any]], path: str | Path, *, title: str | None = None,
                 training: list[dict[str, Any]] | None = None) -> Path:
    """Write the report for rollout `records` (and optional training step records) to `path`."""
    path = Path(path)
    text = render_report(records, title=title or f"gymserve run: {path.stem}", training=training)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def write_training_report(output_dir: str | Path, records: list[dict[str, Any]] | None = None) -> Path:
    """`report.html` in a training run's `output_dir`: its `metrics.jsonl` curves, plus the
    rollout `records` when the caller kept them. Unreadable metric lines are skipped."""
    output_dir = Path(output_dir)
    training = []
    metrics = output_dir / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                training.append(record)
    return write_report(records or [], output_dir / "report.html", title=f"gymserve train: {output_dir.name}",
                        training=training)
