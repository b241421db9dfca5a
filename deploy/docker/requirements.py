"""The image's Python requirements, read from pyproject.toml so the dependency layer needs no sources.

    requirements.py PYPROJECT            -> the servers' requirements (core + the `serve` extra, no torch)
    requirements.py --torch PYPROJECT    -> the pinned torch requirement
    requirements.py --check PYPROJECT    -> exit 1 if an installed torch is a CUDA build
"""
from __future__ import annotations

import sys
import tomllib


def requirements(pyproject: str) -> tuple[list[str], str]:
    with open(pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["serve"]]
    torch = [r for r in wanted if r.replace(" ", "").startswith("torch==")]
    if len(torch) != 1:
        sys.exit("pyproject.toml: the serve extra must pin torch exactly (torch==X): "
                 "an unpinned torch pulls CUDA wheels")
    return [r for r in wanted if r not in torch], torch[0]


def main() -> None:
    flag, path = (sys.argv[1], sys.argv[2]) if len(sys.argv) > 2 else ("", sys.argv[1])
    rest, torch = requirements(path)
    if flag == "--torch":
        print(torch)
    elif flag == "--check":
        from importlib.metadata import distributions
        cuda = sorted(d.metadata["Name"] for d in distributions() if d.metadata["Name"].startswith("nvidia-"))
        if cuda:
            sys.exit(f"CUDA packages in a CPU image: {cuda}")
    else:
        print("\n".join(rest))


if __name__ == "__main__":
    main()
