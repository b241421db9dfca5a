"""`gymserve status [--head URL]`: servers, health and throughput, from the head's `/health/servers`."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import httpx

from services.core.auth import auth_headers
from services.core.config import DEFAULT_HEAD_PORT
from services.core.directory import instance_name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--head", default=None, metavar="URL",
                        help=f"head URL (default: $GYMSERVE_HEAD_URL or http://127.0.0.1:{DEFAULT_HEAD_PORT})")
    parser.add_argument("--json", action="store_true", help="print the raw JSON report")
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for the head")


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _report_from_instances(head: str, timeout: float) -> dict[str, Any] | None:
    """The health report built here for a head that has none (NeMo-Gym 0.7.0's): its
    `/server_instances` rows, by instance name, each probed at `GET {url}/health`."""
    try:
        listed = httpx.get(f"{head}/server_instances", headers=auth_headers(), timeout=timeout, trust_env=False)
        rows = listed.json() if listed.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(rows, list):
        return None
    servers = []
    for row in rows:
        if not isinstance(row, dict) or not instance_name(row) or not isinstance(row.get("url"), str):
            continue
        try:
            healthy = httpx.get(f"{row['url'].rstrip('/')}/health", timeout=timeout, trust_env=False).status_code == 200
        except httpx.HTTPError:
            healthy = False
        servers.append({**row, "name": instance_name(row), "health": "ready" if healthy else "down"})
    return {"head": {"url": head}, "ready": sum(r["health"] == "ready" for r in servers), "total": len(servers),
            "servers": servers}


def run(args: argparse.Namespace) -> int:
    head = (args.head or os.environ.get("GYMSERVE_HEAD_URL") or f"http://127.0.0.1:{DEFAULT_HEAD_PORT}").rstrip("/")
    try:
        response = httpx.get(f"{head}/health/servers", headers=auth_headers(), timeout=args.timeout, trust_env=False)
    except httpx.HTTPError as exc:
        print(f"gymserve status: cannot reach the head at {head}: {type(exc).__name__}: {exc} "
              "(is `gymserve up` running? use --head URL)", file=sys.stderr)
        return 1
    if response.status_code == 404:  # a NeMo-Gym head: no health report, only its server list
        report = _report_from_instances(head, args.timeout)
        if report is None:
            print(f"gymserve status: the head at {head} serves neither /health/servers nor /server_instances",
                  file=sys.stderr)
            return 1
        response = httpx.Response(200, json=report)
    if response.status_code != 200:
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text[:300]
        print(f"gymserve status: the head at {head} answered {response.status_code}: {detail}", file=sys.stderr)
        return 1
    report = response.json()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if report["ready"] == report["total"] else 3

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"head {head}: {report['ready']}/{report['total']} servers ready")
    for column in ("name", "type", "kind", "url", "pid", "health", "req/s", "requests", "mean ms", "in flight",
                   "failures"):
        table.add_column(column, justify="right" if column in ("req/s", "requests", "mean ms", "in flight",
                                                               "failures", "pid") else "left")
    styles = {"ready": "green", "starting": "yellow", "down": "red"}
    for row in report["servers"]:
        health = row.get("health", "?")
        table.add_row(row["name"], _fmt(row.get("server_type")), _fmt(row.get("kind")), _fmt(row.get("url")),
                      _fmt(row.get("pid")), f"[{styles.get(health, 'white')}]{health}[/]",
                      _fmt(row.get("requests_per_s")), _fmt(row.get("requests_total")),
                      _fmt(row.get("mean_latency_ms")), _fmt(row.get("in_flight")), _fmt(row.get("failures_total")))
    Console(width=None if sys.stdout.isatty() else 240).print(table)  # piped: do not cut names
    return 0 if report["ready"] == report["total"] else 3
