"""The `gymserve` console script. Each subcommand lives in `gymserve/commands/<name>.py`
with `add_arguments(parser)` and `run(args) -> int`, imported only when used."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

COMMANDS = {
    "up": "start the head and every server of a stack, restart crashed ones, stop all on Ctrl-C",
    "serve": "run one server in the foreground (what a container runs)",
    "status": "servers, health and throughput from the head",
    "dashboard": "open the head's dashboard in a browser when the head requires GYMSERVE_API_KEY",
    "prepare": "validate, convert, stamp agent_ref, blend and split datasets",
    "collect": "send rows to their agents and write rollouts, failures and metrics",
    "train": "GRPO/GDPO training with TRL's GRPOTrainer using gymserve rollouts",
    "check": "conformance checks of one server kind (exit 0 when they all pass)",
    "new": "scaffold a new environment: gymserve new env NAME",
    "catalogue": "every environment this install can serve (ours, NeMo-Gym's, packages') and why some do not run",
}


def _command(name: str):
    return importlib.import_module(f"gymserve.commands.{name}")


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gymserve", description="RL environments for LLMs as microservices")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, help_text in COMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # only the command being run is imported
            _command(name).add_arguments(sub_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:  # httpx logs every request at INFO: heartbeats and probes would drown the logs
        logging.getLogger("httpx").setLevel(logging.WARNING)
    from services.core.auth import adopt_default_key
    from services.core.config import ConfigError

    if args.command not in ("serve", "up", "check", "new"):
        adopt_default_key()  # a client finds the key `gymserve up` generated without the user exporting it

    try:
        return int(_command(args.command).run(args) or 0)
    except ConfigError as exc:
        print(f"gymserve {args.command}: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
