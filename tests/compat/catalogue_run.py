"""The whole NeMo-Gym 0.7.0 catalogue behind gymserve (`make catalogue`): every resources server of the
wheel is classified, tried and, where it runs, compared with NeMo-Gym's own agent on its example rows.

For each server: the reason its own files rule it out (`static_reason`), else its virtualenv is built
(a requirement that does not install is the reason), else it is started with `gymserve up` in a
stack of its own (a start that fails gives the reason from its log), else its example rows are
played by the scripted policy of its recorded rollouts through gymserve and through NeMo-Gym's own
simple_agent (`nemo_hosted`), and the rewards compared. The result goes to
`gymserve/nemo_gym/catalogue-0.7.0.json` and the page to docs/catalogue.md.

    python -m tests.compat.catalogue_run [--only a,b] [--timeout-s 600]
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from gymserve.nemo_gym.catalogue import RESULTS, agents_of, static_reason
from gymserve.nemo_gym.venv import base_venv, server_venv
from gymserve.nemo_gym.wheel import package_root, server_files, server_names
from tests.compat import catalogue_page, nemo_gym
from tests.compat.nemo_hosted import NeMoSide, collect_through_gymserve, replay_rows, stack_yaml
from tests.integration.up_helpers import Up


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "WARNING" not in ln]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return ((errors or lines or ["(no output)"])[-1])[:300]


def try_server(name: str, venv: Path, timeout_s: float) -> dict[str, Any]:
    files = server_files(package_root(venv), name)
    result: dict[str, Any] = {"name": name, "runs_here": False, "agrees": None, "rows": 0,
                              "agents": agents_of(files), "reason": static_reason(files)}
    if result["reason"]:
        return result
    try:
        server_venv(name, files.requirements)
    except subprocess.CalledProcessError as exc:
        result["reason"] = f"requirements do not install here: {_last_line(exc.stderr or exc.stdout or '')}"
        return result
    rows, why_not = replay_rows(files)
    with tempfile.TemporaryDirectory(prefix="ng-cat-") as tmp:
        workdir = Path(tmp)
        (workdir / "stack.yaml").write_text(stack_yaml([name]))
        up = Up("-c", str(workdir / "stack.yaml"), "--ready-timeout", str(int(timeout_s)))
        side = NeMoSide(venv, workdir)
        try:
            try:
                up.wait_for(r"all 4 servers ready", timeout_s=timeout_s)
            except AssertionError:
                log = up.output
                marker = log.rfind("[nemo-gym]")
                result["reason"] = "does not start here: " + _last_line(log[marker:] if marker >= 0 else log)
                return result
            head = up.wait_for(r"head on (http://\S+)").group(1)
            result["runs_here"] = True
            if why_not:
                result["reason"] = None
                result["note"] = f"runs; not compared: {why_not}"
                return result
            ours, failures = collect_through_gymserve(head, f"nemo_{name}_agent", rows, workdir, up.env)
            info = httpx.get(f"{head}/servers/nemo_{name}/ready", headers=up.auth, timeout=10).json()
            side.start_stub()
            agent = side.start_agent(files.instance, files.impl, info["upstream"])
            theirs = side.run_rows(agent, rows)
            result["rows"] = len(rows)
            mine = [r.get("reward") if not r.get("mask_sample") else None for r in ours]
            ref = [r.get("reward") for r in theirs]
            if failures or len(ours) != len(rows) or None in mine:
                kinds = sorted({str(r.get("failure_reason") or r.get("failure_kind"))[:200]
                                for r in [*failures, *ours] if r.get("mask_sample") or r in failures})
                result["runs_here"] = False
                result["reason"] = f"fails on its example rows: {'; '.join(kinds)[:300]}"
                if "simple_agent" not in result["agents"]:  # its rows are made for another agent
                    result["reason"] = (f"NeMo-Gym agent not hosted: its config drives it with "
                                        f"{', '.join(result['agents']) or 'no agent'}; with our simple_agent it "
                                        + result["reason"])
            elif None in ref:
                result["agrees"] = None
                result["note"] = "runs; NeMo-Gym's own agent failed on its rows: " + _last_line(json.dumps(theirs))
            else:
                result["agrees"] = mine == ref
                result["rewards"] = mine
                if not result["agrees"]:
                    result["reference_rewards"] = ref
        finally:
            side.close()
            if up.proc.poll() is None:
                os.killpg(up.proc.pid, signal.SIGTERM)
                try:
                    up.wait(60)
                except Exception:
                    pass
            up.kill()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="comma-separated servers (default: all of the wheel)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="start-up limit of one server")
    parser.add_argument("--static", action="store_true", help="only classify by the servers' files (no start)")
    args = parser.parse_args(argv)
    venv = nemo_gym.venv()
    root = package_root(venv)
    previous = {r["name"]: r for r in json.loads(RESULTS.read_text())["servers"]} if RESULTS.exists() else {}

    def save() -> None:
        RESULTS.write_text(json.dumps({"nemo_gym": nemo_gym.VERSION, "generated": datetime.date.today().isoformat(),
                                       "servers": [previous[k] for k in sorted(previous)]}, indent=1) + "\n")

    for name in server_names(root):  # every server has a line, tried or not
        if name not in previous:
            files = server_files(root, name)
            previous[name] = {"name": name, "runs_here": False, "agrees": None, "rows": 0,
                              "agents": agents_of(files), "reason": static_reason(files) or "not tried yet"}
    save()
    names = [] if args.static else ([n for n in args.only.split(",") if n] or server_names(root))
    for name in names:
        result = try_server(name, venv, args.timeout_s)
        previous[name] = result
        print(json.dumps(result), flush=True)
        save()
    catalogue_page.write()
    counts = catalogue_page.counts(list(previous.values()))
    print(f"{counts['agree']} of {counts['total']} servers run behind gymserve and agree with NeMo-Gym's own agent; "
          f"{counts['runs']} run here")
    return 0


if __name__ == "__main__":
    base_venv()
    sys.exit(main())
