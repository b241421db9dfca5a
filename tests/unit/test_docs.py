"""The documentation stays in shape: a short README that starts with the two commands, one
README per environment with the fixed sections (included by the docs site), no pointer to a
document outside the repository, and an API reference that renders every server kind.

The site itself is built with `mkdocs build --strict` by `make docs` (part of `make test`).
"""
from __future__ import annotations

import glob
import re
import subprocess
from pathlib import Path

import pytest

from gymserve import apiref

ROOT = Path(__file__).resolve().parents[2]
ENV_SECTIONS = ["Row fields", "Reward", "Failure behaviour", "Options", "Example", "Data and tests"]
ENVS = sorted(p.parent.name for p in (ROOT / "services" / "resources").glob("*/app.py"))


def test_readme_starts_with_the_two_commands_and_stays_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the details belong in docs/"
    head = "\n".join(lines[:8])
    assert re.search(r"^make demo\b", head, re.M) and re.search(r"^make test\b", head, re.M), head
    text = "\n".join(lines)
    assert "```mermaid" in text
    # benchmark figures live in docs/benchmarks.md with their command, machine and date
    assert not re.search(r"\d[\d,.]*\s*(req/s|rollouts/s|tokens/s|tok/s|seq/s|items/s|exec/s)", text)


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        return [ROOT / line for line in out.splitlines() if line]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "site", "node_modules"}
        return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def test_nothing_points_to_a_design_document_outside_the_repository() -> None:
    word = "DES" + "IGN"  # spelled apart so this file does not match itself
    pattern = re.compile(rf"{word}(\.md)?\b")
    offenders = []
    for path in _tracked_files():
        if not path.is_file() or path.suffix in {".png", ".jpg", ".gz", ".ico", ".woff", ".woff2"}:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "say it in the project's own words:\n" + "\n".join(offenders)


def test_every_environment_is_listed() -> None:
    assert {"math", "code", "exact_match", "workplace", "reward_model"} <= set(ENVS)


@pytest.mark.parametrize("env", ENVS)
def test_environment_readme_has_the_fixed_sections(env: str) -> None:
    path = ROOT / "services" / "resources" / env / "README.md"
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
    text = path.read_text()
    assert text.startswith(f"# {env}\n"), "the README's title is the environment's name"
    sections = re.findall(r"^## (.+?)\s*$", text, re.M)
    assert sections == ENV_SECTIONS, f"{env}: sections {sections}, expected {ENV_SECTIONS}"
    # the page is included into the docs site from elsewhere: relative links would break
    links = [t for t in re.findall(r"\]\(([^)\s]+)", text) if not re.match(r"https?://", t)]
    assert not links, f"{env}: relative links {links}"
    data = text.split("## Data and tests", 1)[1]
    top = r"(services|datasets|tests|benchmarks|deploy|gymserve|trainer|gateway)/"
    paths = [p for p in re.findall(r"`([^`\s]+)`", data) if re.match(top, p)]
    assert paths, f"{env}: name the data, code and test paths in backticks"
    missing = [p for p in paths if not glob.glob(str(ROOT / p))]
    assert not missing, f"{env}: paths that do not exist: {missing}"


@pytest.mark.parametrize("env", ENVS)
def test_environment_readme_documents_every_option(env: str) -> None:
    from services.core.loader import load_server
    from services.core.resource import ResourceConfig

    own = [f for f in load_server(f"resources/{env}").Config.model_fields if f not in ResourceConfig.model_fields]
    text = (ROOT / "services" / "resources" / env / "README.md").read_text()
    options = text.split("## Options", 1)[1].split("## Example", 1)[0]
    missing = [f for f in own if f"`{f}`" not in options]
    assert not missing, f"{env}: options not under ## Options: {missing}"


@pytest.mark.parametrize("env", ENVS)
def test_environment_page_includes_the_readme(env: str) -> None:
    page = ROOT / "docs" / "environments" / f"{env}.md"
    include = f'--8<-- "services/resources/{env}/README.md"'
    assert page.is_file() and page.read_text().strip() == include, \
        f"create {page.relative_to(ROOT)} holding the one line {include} (the site includes the README)"
    assert f"environments/{env}.md" in (ROOT / "mkdocs.yml").read_text(), \
        f"list environments/{env}.md under Environments in mkdocs.yml's nav"


def test_api_reference_renders_every_server_kind() -> None:
    markdown = apiref.reference_markdown()
    for kind in apiref.all_kinds():
        assert f"### `{kind}`" in markdown
    for endpoint in ("`POST /verify`", "`POST /seed_session`", "`POST /run`", "`POST /v1/responses`",
                     "`GET /server_instances`", "`ANY /servers/{name}/{path}`"):
        assert endpoint in markdown
    assert "`GET /health`" not in markdown  # common endpoints are documented once, on the page


def test_api_reference_renders_declared_models() -> None:
    """Typed request/reply models show up as linked schema sections with their fields."""
    spec = {
        "paths": {"/verify": {"post": {
            "summary": "Verify", "description": "Score a rollout.",
            "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/VerifyRequest"}}}},
            "responses": {"200": {"description": "OK", "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/VerifyReply"}}}},
                "422": {"description": "Validation Error", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/HTTPValidationError"}}}}}}}},
        "components": {"schemas": {
            "VerifyRequest": {"type": "object", "required": ["response"], "additionalProperties": True,
                              "properties": {"response": {"type": "object"},
                                             "expected_answer": {"anyOf": [{"type": "string"}, {"type": "null"}]}}},
            "VerifyReply": {"type": "object", "description": "The row echoed with the reward.",
                            "properties": {"reward": {"type": "number", "default": 0.0},
                                           "failure_kind": {"enum": ["timeout", "crash"]},
                                           "reward_components": {"type": "object",
                                                                 "additionalProperties": {"type": "number"}}}},
            "HTTPValidationError": {"type": "object"}}},
    }
    markdown = apiref.render({"resources/example": spec})
    assert "Request body (application/json): [VerifyRequest](#schema-verifyrequest)" in markdown
    assert "| 200 | OK | [VerifyReply](#schema-verifyreply) |" in markdown
    assert "[error body](#errors)" in markdown
    assert "### VerifyReply { #schema-verifyreply }" in markdown
    assert "| `response` | `object` | yes |" in markdown
    assert "| `expected_answer` | `string` or `null` | no |" in markdown
    assert '`"timeout"` \\| `"crash"`' in markdown
    assert "object of `number`" in markdown
    assert "HTTPValidationError {" not in markdown


def test_api_reference_reports_a_kind_it_cannot_build() -> None:
    """The docs hook turns this into a warning naming the kind, which fails `mkdocs build --strict`."""
    errors: list[str] = []
    markdown = apiref.reference_markdown(["head", "resources/no_such_env"],
                                         on_error=lambda kind, exc: errors.append(kind))
    assert errors == ["resources/no_such_env"]
    assert "### `head`" in markdown
    with pytest.raises(Exception, match="no_such_env"):
        apiref.reference_markdown(["resources/no_such_env"])
