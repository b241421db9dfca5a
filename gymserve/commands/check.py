"""`gymserve check KIND [key=value ...]`: conformance checks of one server kind; exit 0 when all pass."""
from __future__ import annotations

import argparse
import json
import sys

from services.core.config import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", help="head, resources/<env>, agents/<agent> or models/<backend>")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="options of the server under check")
    parser.add_argument("--json", action="store_true", help="print the outcomes as JSON instead of a list")
    parser.set_defaults(accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    from gymserve.conformance import run_check

    stray = [a for a in getattr(args, "extra", []) if "=" not in a or a.startswith("-")]
    if stray:
        raise ConfigError(f"unrecognized arguments: {' '.join(stray)}")
    report = run_check(args.kind, list(args.overrides) + list(getattr(args, "extra", [])))
    if args.json:
        print(json.dumps({"kind": report.kind, "ok": report.ok,
                          "checks": [o.__dict__ for o in report.outcomes]}, indent=2))
    else:
        print(report.render(), file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1
