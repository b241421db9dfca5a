"""`GET /dashboard`: rewards per environment, failures, traffic, server health and training curves.

The page is served with its server table already filled in (it reads fine without
JavaScript and refreshes itself then); its script (`static/dashboard.js`) polls
`GET /dashboard/data` and draws the charts with uPlot, shipped in `static/` (no CDN:
the head may run on a machine with no internet).
"""
from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any

from services.core.metrics import bins_from_buckets

from .health import HealthMonitor
from .series import WINDOW_S
from .training import TrainingLog

STATIC_DIR = Path(__file__).parent / "static"
# What `/dashboard/static/{name}` serves: our own files and the vendored chart library.
STATIC_FILES = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot.LICENSE": "text/plain; charset=utf-8",
}
FAILURE_KINDS = ("timeout", "crash", "bad_request", "upstream", "sandbox", "context_overflow")
TIMELINE_POINTS = 360
_COLORS = {"ready": "#1a7f37", "starting": "#9a6700", "down": "#cf222e"}
# (heading, row field) of the server table; the script fills the same columns.
COLUMNS = (("name", "name"), ("type", "server_type"), ("kind", "kind"), ("url", "url"), ("pid", "pid"),
           ("health", "health"), ("req/s", "requests_per_s"), ("requests", "requests_total"),
           ("p50 ms", "latency_p50_ms"), ("p90 ms", "latency_p90_ms"), ("p99 ms", "latency_p99_ms"),
           ("mean ms", "mean_latency_ms"), ("in flight", "in_flight"), ("failures", "failures_total"))


def _cell(value: Any) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        return f"{value:g}"
    return html.escape(str(value))


def _row_html(r: dict[str, Any]) -> str:
    cells = []
    for _, key in COLUMNS:
        value = r.get(key)
        attrs = f' data-field="{key}"'
        if key == "url":
            inner = f'<a href="{html.escape(r.get("url") or "")}">{_cell(value)}</a>'
        elif key == "health":
            inner = _cell(value)
            attrs += f' class="health" style="color:{_COLORS.get(r.get("health", ""), "#57606a")}"'
        else:
            inner = _cell(value)
        cells.append(f"<td{attrs}>{inner}</td>")
    return f'<tr data-server="{html.escape(r["name"])}">{"".join(cells)}</tr>'


def sorted_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r.get("server_type", ""), r["name"]))


def render(head: dict[str, Any], rows: list[dict[str, Any]], refresh_s: float = 5) -> str:
    """The page, with the server table filled in from `rows` (a `/health/servers` report's)."""
    ready = sum(1 for r in rows if r.get("healthy"))
    body = "".join(_row_html(r) for r in sorted_rows(rows))
    headings = "".join(f"<th>{name}</th>" for name, _ in COLUMNS)
    refresh = max(1, round(refresh_s))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<noscript><meta http-equiv="refresh" content="{refresh}"></noscript>
<title>gymserve dashboard</title>
<link rel="stylesheet" href="/dashboard/static/uPlot.min.css">
<link rel="stylesheet" href="/dashboard/static/dashboard.css">
</head><body data-refresh-s="{refresh}">
<header>
<h1>gymserve</h1>
<p id="summary">head {_cell(head.get('url'))} &middot; <span id="ready-count">{ready}/{len(rows)}</span> servers ready
&middot; refreshes every {refresh}s &middot; <span id="updated">served {time.strftime('%H:%M:%S')}</span>
&middot; <a href="/health/servers">JSON</a> &middot; <a href="/dashboard/data">chart data</a>
&middot; <a href="/training/metrics">training records</a> &middot; <a href="/server_instances">instances</a></p>
</header>
<section id="training" hidden><h2>Training <span id="training-run" class="muted"></span></h2>
<div class="grid" id="training-charts"></div></section>
<section><h2>Rewards by environment <span class="muted">judged verify replies; masked failures apart</span></h2>
<div class="grid" id="environments"><p class="muted">waiting for data&hellip;</p></div></section>
<section><h2>Traffic <span class="muted">each point covers the minute before it</span></h2>
<div class="grid" id="traffic"></div></section>
<section><h2>Masked failures by kind <span class="muted">rollouts and verify replies masked, never scored 0</span></h2>
<div id="failures" class="scroll"></div></section>
<section><h2>Servers</h2>
<div class="scroll"><table id="servers"><thead><tr>{headings}</tr></thead>
<tbody>
{body or f'<tr><td colspan="{len(COLUMNS)}">no servers registered</td></tr>'}
</tbody></table></div></section>
<script src="/dashboard/static/uPlot.iife.min.js"></script>
<script src="/dashboard/static/dashboard.js"></script>
</body></html>
"""


def _timeline(monitor: HealthMonitor, names: list[str]) -> dict[str, Any]:
    """Per-server series on one shared time axis (servers sampled in the same round share a time)."""
    per_server = {n: monitor.histories[n].series() for n in names if n in monitor.histories}
    times = sorted({t for points in per_server.values() for t, _ in points})[-TIMELINE_POINTS:]
    index = {t: i for i, t in enumerate(times)}
    fields = ("requests_per_s", "latency_p50_ms", "latency_p99_ms", "reward_mean")
    out: dict[str, Any] = {"t": times, "servers": {}}
    for name, points in per_server.items():
        columns: dict[str, list[float | None]] = {f: [None] * len(times) for f in fields}
        for t, w in points:
            i = index.get(t)
            if i is None:
                continue
            values = (w.requests_per_s, w.latency_ms(0.5), w.latency_ms(0.99), w.reward_mean)
            for f, v in zip(fields, values):
                columns[f][i] = None if v is None else round(v, 6)
        out["servers"][name] = columns
    return out


def payload(head: dict[str, Any], rows: list[dict[str, Any]], monitor: HealthMonitor, training: TrainingLog,
            refresh_s: float) -> dict[str, Any]:
    """`GET /dashboard/data`: everything the page draws, from the head's last probe round."""
    rows = sorted_rows(rows)
    environments = []
    for r in rows:
        if r.get("server_type") != "resources_servers":
            continue
        history = monitor.histories.get(r["name"])
        latest = history.latest if history else None
        environments.append({
            "name": r["name"], "kind": r.get("kind"), "health": r.get("health"),
            "rewards_total": r.get("rewards_total"), "reward_mean": r.get("reward_mean"),
            "masked_total": r.get("failures_total"), "failures_by_kind": r.get("failures_by_kind") or {},
            "judge": r.get("judge"),
            "histogram": bins_from_buckets(latest.reward_buckets) if latest else [],
        })
    kinds = sorted({k for r in rows for k in (r.get("failures_by_kind") or {})} | set(FAILURE_KINDS),
                   key=lambda k: (k not in FAILURE_KINDS, FAILURE_KINDS.index(k) if k in FAILURE_KINDS else 0, k))
    run = training.latest_run()
    return {
        "head": head, "generated_at": monitor.sampled_at or time.time(), "refresh_s": refresh_s,
        "window_s": WINDOW_S, "ready": sum(1 for r in rows if r.get("healthy")), "total": len(rows),
        "columns": COLUMNS, "servers": rows, "environments": environments, "failure_kinds": list(kinds),
        "timeline": _timeline(monitor, [r["name"] for r in rows]),
        "training": None if run is None else {"run": run, "runs": training.runs(), "steps": training.records(run)},
    }
