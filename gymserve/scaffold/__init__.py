"""`gymserve new env NAME`: a new environment folder that passes `gymserve check` as generated."""
from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from services.core.config import ConfigError

from . import templates

NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


@dataclass
class Scaffolded:
    root: Path
    created: list[Path] = field(default_factory=list)
    stack: Path | None = None
    default_stack: Path | None = None
    nav: Path | None = None


POLICY = "policy_model"


def env_entries(name: str) -> dict[str, dict[str, str]]:
    """The stack entries of a new environment: the server and a simple agent for it."""
    return {name: {"kind": f"resources/{name}"},
            f"{name}_simple_agent": {"kind": "agents/simple_agent", "resources_server": name,
                                     "model_server": POLICY}}


def new_env(name: str, root: Path, *, stack: Path | None = None) -> Scaffolded:
    """Write `services/resources/NAME/` (app, rows, README), its test, and register it in `stack`."""
    if not NAME.match(name) or keyword.iskeyword(name):
        raise ConfigError(f"environment name {name!r}: use lower-case letters, digits and _, starting with a letter")
    resources = root / "services" / "resources"
    if not resources.is_dir():
        raise ConfigError(f"{root} has no services/resources folder: run this at the root of a gymserve checkout "
                          "(or pass --root)")
    folder = resources / name
    if folder.exists():
        raise ConfigError(f"services/resources/{name} exists already")
    test = root / "tests" / "integration" / f"test_env_{name}.py"
    if test.exists():
        raise ConfigError(f"{test.relative_to(root)} exists already")
    stack = stack or root / "deploy" / "stacks" / f"{name}.yaml"
    stack_name = stack.relative_to(root) if stack.is_absolute() and stack.is_relative_to(root) else stack
    cls = "".join(part.capitalize() for part in name.split("_")) or "Env"
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": q}]},
             "agent_ref": {"type": "responses_api_agents", "name": f"{name}_simple_agent"},
             "expected_answer": a, "expected_reward": 1.0} for q, a in templates.EXAMPLE_ROWS]
    data = root / "datasets" / name
    if data.exists():
        raise ConfigError(f"datasets/{name} exists already")
    files = {
        folder / "__init__.py": "",
        folder / "app.py": templates.APP.format(name=name, cls=cls),
        folder / "README.md": templates.README.format(name=name, stack=stack_name),
        data / "example.jsonl": "".join(json.dumps(r) + "\n" for r in rows),
        data / "README.md": templates.DATA_README.format(name=name),
        test: templates.TEST.format(name=name),
    }
    mkdocs, page = root / "mkdocs.yml", root / "docs" / "environments" / f"{name}.md"
    if mkdocs.exists():  # the docs site lists every environment: a page that includes the README
        if page.exists():
            raise ConfigError(f"{page.relative_to(root)} exists already")
        files[page] = templates.DOCS_PAGE.format(name=name)
    default = root / "gymserve" / "stacks" / "default.yaml"
    out = Scaffolded(root)
    out.stack = register(stack, name, stack_name)  # first: a clash there leaves nothing half-written
    if default.exists() and default != stack:  # `gymserve up` and `make demo` serve every example dataset
        out.default_stack = register(default, name)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        out.created.append(path)
    if mkdocs.exists():
        add_to_nav(mkdocs, name)
        out.nav = mkdocs
    return out


def add_to_nav(mkdocs: Path, name: str) -> None:
    """List `environments/NAME.md` in mkdocs.yml's nav after the last environment page (text edit: comments stay)."""
    lines = mkdocs.read_text(encoding="utf-8").splitlines(keepends=True)
    last = max((i for i, line in enumerate(lines) if re.search(r":\s*environments/\w+\.md\s*$", line)), default=None)
    if last is None:
        raise ConfigError(f"{mkdocs}: no environments/<env>.md entry in its nav to add {name} next to")
    indent = lines[last][:len(lines[last]) - len(lines[last].lstrip())]
    lines.insert(last + 1, f"{indent}- {name}: environments/{name}.md\n")
    mkdocs.write_text("".join(lines), encoding="utf-8")


def register(stack: Path, name: str, shown: str | Path = "") -> Path:
    """Add the environment and its agent (and a policy model when the stack has none) to a stack file,
    created with a head when missing."""
    entries = env_entries(name)
    if not stack.exists():
        stack.parent.mkdir(parents=True, exist_ok=True)
        entries = {POLICY: {"kind": "models/hf"}, **entries}
        text = templates.STACK.format(name=name, stack=shown)
        text += "".join(f"  {key}: {json.dumps(value)}\n" for key, value in entries.items())
        stack.write_text(text, encoding="utf-8")
        return stack
    data = yaml.safe_load(stack.read_text(encoding="utf-8")) or {}
    servers = data.get("servers") or {}
    if POLICY not in servers:
        entries = {POLICY: {"kind": "models/hf"}, **entries}
    clash = [key for key in entries if key in servers]
    if clash:
        raise ConfigError(f"{stack}: servers {', '.join(clash)} exist already")
    with stack.open("a", encoding="utf-8") as fh:  # appended, so the file's comments stay
        if "servers" not in data:
            fh.write("servers:\n")
        fh.write(f"  # added by gymserve new env {name}\n")
        fh.write("".join(f"  {key}: {json.dumps(value)}\n" for key, value in entries.items()))
    return stack


def new_package_env(name: str, folder: Path) -> Scaffolded:
    """Write a pip-installable environment in `folder` (outside any gymserve checkout): the same app and
    rows as `new_env`, served as `kind: NAME` through the `gymserve.environments` entry point."""
    if not NAME.match(name) or keyword.iskeyword(name):
        raise ConfigError(f"environment name {name!r}: use lower-case letters, digits and _, starting with a letter")
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(f"{folder} exists already and is not empty")
    module = f"gymserve_{name}"
    cls = "".join(part.capitalize() for part in name.split("_")) or "Env"
    rows = [{"responses_create_params": {"input": [{"role": "user", "content": q}]},
             "agent_ref": {"type": "responses_api_agents", "name": f"{name}_simple_agent"},
             "expected_answer": a, "expected_reward": 1.0} for q, a in templates.EXAMPLE_ROWS]
    files = {
        folder / "pyproject.toml": templates.PACKAGE_PYPROJECT.format(name=name, dist=name.replace("_", "-"),
                                                                      module=module),
        folder / "README.md": templates.PACKAGE_README.format(name=name, module=module),
        folder / module / "__init__.py": "",
        folder / module / "app.py": templates.APP.format(name=name, cls=cls).replace(
            f"Generated by `gymserve new env {name}`", f"Generated by `gymserve new env {name} --package`"),
        folder / module / "example.jsonl": "".join(json.dumps(r) + "\n" for r in rows),
    }
    out = Scaffolded(folder)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        out.created.append(path)
    return out
