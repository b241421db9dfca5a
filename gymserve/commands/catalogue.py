"""`gymserve catalogue [--json] [--scaffold NAME ...] [-o STACK.yaml]`: every environment this install can
serve (ours, NeMo-Gym's, installed packages'), whether it runs here and, if not, why."""
from __future__ import annotations

import argparse
import json
import shutil
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from services.core.config import ConfigError

# what some of our own environments need beyond this install
OUR_NEEDS = {"resources/terminal": "docker", "resources/swe": "docker"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="a JSON list of {name, source, runs_here, reason}")
    parser.add_argument("--scaffold", nargs="+", metavar="NAME", default=None,
                        help="write a stack serving these environments, each with a simple_agent (names as listed)")
    parser.add_argument("-o", "--output", type=Path, default=None, help="where --scaffold writes (default: stdout)")
    parser.add_argument("--all", action="store_true", help="list the environments that do not run here too "
                        "(default for --json)")


def entries() -> list[dict[str, Any]]:
    from gymserve.nemo_gym.catalogue import recorded
    from services.core.loader import available_kinds

    out: list[dict[str, Any]] = []
    for kind in available_kinds():
        if not kind.startswith("resources/"):
            continue
        need = OUR_NEEDS.get(kind)
        missing = need is not None and shutil.which(need) is None
        out.append({"name": kind, "source": "gymserve", "runs_here": not missing,
                    "reason": f"needs {need}, which is not installed here" if missing else None,
                    "needs": need or ""})
    for name, result in sorted(recorded().items()):
        out.append({"name": f"nemo_gym/{name}", "source": "nemo-gym 0.7.0", "runs_here": bool(result["runs_here"]),
                    "reason": result.get("reason"), "needs": result.get("needs", "")})
    for ep in entry_points(group="gymserve.environments"):
        dist = getattr(ep, "dist", None)
        out.append({"name": ep.name, "source": f"package {dist.name if dist else ep.module}", "runs_here": True,
                    "reason": None, "needs": ""})
    return out


def scaffold(names: list[str], known: dict[str, dict[str, Any]]) -> str:
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"--scaffold: no environment named {', '.join(unknown)} (see gymserve catalogue)")
    lines = ["# written by gymserve catalogue --scaffold; start it with gymserve up -c THIS_FILE",
             "head: {host: 127.0.0.1, port: 11000}", "servers:", "  policy_model: {kind: models/hf}"]
    for name in names:
        if not known[name]["runs_here"]:
            lines.append(f"  # {name} does not run here: {known[name]['reason']}")
        short = name.split("/", 1)[-1] if not name.startswith("nemo_gym/") else "nemo_" + name.split("/", 1)[1]
        lines.append(f"  {short}: {{kind: {name}}}")
        lines.append(f"  {short}_simple_agent: {{kind: agents/simple_agent, resources_server: {short}, "
                     "model_server: policy_model}")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    found = entries()
    if args.scaffold:
        text = scaffold(args.scaffold, {e["name"]: e for e in found})
        if args.output:
            args.output.write_text(text)
            print(f"wrote {args.output} ({len(args.scaffold)} environments)")
        else:
            print(text, end="")
        return 0
    if args.json:
        print(json.dumps([{k: e[k] for k in ("name", "source", "runs_here", "reason")} for e in found], indent=1))
        return 0
    shown = found if args.all else [e for e in found if e["runs_here"]]
    width = max(len(e["name"]) for e in shown) if shown else 10
    for e in shown:
        note = e["reason"] if not e["runs_here"] else (f"needs {e['needs']}" if e["needs"] else "")
        print(f"{e['name']:<{width}}  {e['source']:<16} {'yes' if e['runs_here'] else 'no ':<4} {note or ''}".rstrip())
    hidden = len(found) - len(shown)
    print(f"{sum(e['runs_here'] for e in found)} of {len(found)} environments run here"
          + (f" ({hidden} that do not: gymserve catalogue --all)" if hidden else ""))
    return 0
