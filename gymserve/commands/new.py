"""`gymserve new env NAME [--stack FILE] [--root DIR] [--package DIR]`: scaffold an environment that passes `gymserve check`."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=["env"], help="what to create (an environment)")
    parser.add_argument("name", help="environment name: lower-case letters, digits and _")
    parser.add_argument("--stack", type=Path, default=None,
                        help="stack file to register it in (default deploy/stacks/NAME.yaml; added to when it exists)")
    parser.add_argument("--root", type=Path, default=Path("."), help="gymserve checkout to write into (default .)")
    parser.add_argument("--package", type=Path, default=None, metavar="DIR",
                        help="write a pip-installable package in DIR instead (outside the checkout; "
                             "served as `kind: NAME` through the gymserve.environments entry point)")


def run(args: argparse.Namespace) -> int:
    from gymserve.scaffold import new_env, new_package_env

    if args.package is not None:
        made = new_package_env(args.name, args.package.resolve())
        for path in made.created:
            print(f"created {path}")
        print(f"next: pip install {args.package} && gymserve check {args.name}")
        return 0

    root = args.root.resolve()
    stack = None if args.stack is None else (args.stack if args.stack.is_absolute() else root / args.stack)
    done = new_env(args.name, root, stack=stack)
    for path in done.created:
        print(f"created {path.relative_to(root)}")
    if done.stack:
        shown = done.stack.relative_to(root) if done.stack.is_relative_to(root) else done.stack
        print(f"registered {args.name} and {args.name}_simple_agent in {shown}")
    if done.default_stack:
        print(f"registered {args.name} and {args.name}_simple_agent in {done.default_stack.relative_to(root)} "
              "(gymserve up, make demo)")
    if done.nav:
        print(f"listed environments/{args.name}.md in {done.nav.relative_to(root)}")
    print(f"next: .venv/bin/gymserve check resources/{args.name}")
    return 0
