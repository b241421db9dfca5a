"""The HTTP API reference, generated from the servers' own OpenAPI schemas.

Every server kind's FastAPI app is built in-process (`build(Config(...))` only: start-up
hooks do not run, so no model, worker pool or sandbox starts) and its `openapi()` is
rendered as Markdown. The docs build calls this as a MkDocs hook (`mkdocs.yml: hooks`),
replacing the marker in `docs/reference/api.md`, so the reference can never drift from
the code and gets richer as soon as an endpoint declares typed request/reply models.

`python -m gymserve.apiref` prints the same Markdown.
"""
from __future__ import annotations

import json
import warnings
from typing import Any

MARKER = "<!-- gymserve-api-reference -->"

# Options some kinds require before they can be built; placeholders, never contacted.
PLACEHOLDER_OPTIONS: dict[str, Any] = {
    "resources_url": "http://127.0.0.1:9",
    "model_url": "http://127.0.0.1:9",
    "user_model_url": "http://127.0.0.1:9",
    "base_url": "http://127.0.0.1:9/v1",
    "model_name": "placeholder-model",
    "judge_model_server": "http://127.0.0.1:9",
}

# Endpoints every server has; documented once instead of under each kind.
COMMON_PATHS = ("/health", "/ready")

FAMILY_TITLES = {
    "head": "Head",
    "resources": "Resource servers (environments)",
    "agents": "Agents",
    "models": "Model servers",
}

_METHODS = ("get", "post", "put", "patch", "delete")


def build_openapi(kind: str) -> dict[str, Any]:
    """The OpenAPI document of one server kind, built without starting anything."""
    from pydantic import ValidationError

    from services.core.loader import load_server

    module = load_server(kind)
    name = kind.rsplit("/", 1)[-1]
    try:
        config = module.Config(name=name, kind=kind)
    except ValidationError:
        fields = getattr(module.Config, "model_fields", {})
        extra = {k: v for k, v in PLACEHOLDER_OPTIONS.items() if k in fields}
        config = module.Config(name=name, kind=kind, **extra)
    app = module.build(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate operation ids of multi-method routes
        return app.openapi()


def all_kinds() -> list[str]:
    from services.core.loader import available_kinds

    return ["head", *available_kinds()]


class _Schemas:
    """Component schemas collected across kinds; one section per distinct schema."""

    def __init__(self) -> None:
        self.defs: dict[str, dict[str, Any]] = {}

    def add(self, spec: dict[str, Any]) -> None:
        for name, schema in spec.get("components", {}).get("schemas", {}).items():
            if name in ("HTTPValidationError", "ValidationError"):
                continue
            self.defs.setdefault(name, schema)


def _anchor(name: str) -> str:
    return "schema-" + "".join(c if c.isalnum() else "-" for c in name.lower())


def type_of(schema: dict[str, Any] | bool | None, schemas: _Schemas | None = None) -> str:
    """A short Markdown rendering of a JSON schema's type."""
    if schema is None or schema is True or schema == {}:
        return "any"
    if schema is False:
        return "nothing"
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if schemas is not None and name in schemas.defs:
            return f"[{name}](#{_anchor(name)})"
        return f"`{name}`"
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            parts = [type_of(s, schemas) for s in schema[key]]
            return " or ".join(dict.fromkeys(parts))
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return type_of(schema["allOf"][0], schemas)
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(f"`{k}`" for k in kind)
    if kind == "array":
        return f"list of {type_of(schema.get('items'), schemas)}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {type_of(schema['additionalProperties'], schemas)}"
    if kind:
        return f"`{kind}`"
    return "any"


def _cell(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _body_schema(content: dict[str, Any] | None) -> tuple[str, dict[str, Any] | None]:
    if not content:
        return "", None
    media, body = next(iter(content.items()))
    return media, body.get("schema")


def render_operation(path: str, method: str, op: dict[str, Any], schemas: _Schemas) -> list[str]:
    lines = [f"#### `{method.upper()} {path}`", ""]
    text = op.get("description") or op.get("summary") or ""
    if text:
        lines += [text.strip(), ""]
    params = op.get("parameters", [])
    if params:
        lines += ["| parameter | in | type | required | description |", "|---|---|---|---|---|"]
        for p in params:
            lines.append(f"| `{p['name']}` | {p.get('in', '')} | {type_of(p.get('schema'), schemas)} | "
                         f"{'yes' if p.get('required') else 'no'} | {_cell(p.get('description', ''))} |")
        lines.append("")
    media, req = _body_schema(op.get("requestBody", {}).get("content"))
    if req is not None:
        lines += [f"Request body ({media}): {type_of(req, schemas)}", ""]
    elif method in ("post", "put", "patch"):
        lines += ["Request body: JSON, not described by a schema (see the pages of this kind).", ""]
    responses = op.get("responses", {})
    if responses:
        lines += ["| status | meaning | body |", "|---|---|---|"]
        for status, resp in sorted(responses.items()):
            media, body = _body_schema(resp.get("content"))
            shown = type_of(body, schemas) if media else ""
            if "HTTPValidationError" in json.dumps(body or {}):
                shown = "[error body](#errors) naming the field"
            if media and media != "application/json":
                shown = f"{media}" + (f": {shown}" if body not in (None, {}) else "")
            lines.append(f"| {status} | {_cell(resp.get('description', ''))} | {shown} |")
        lines.append("")
    return lines


def render_schema(name: str, schema: dict[str, Any], schemas: _Schemas) -> list[str]:
    lines = [f"### {name} {{ #{_anchor(name)} }}", ""]
    if schema.get("description"):
        lines += [schema["description"].strip(), ""]
    props = schema.get("properties")
    if props:
        required = set(schema.get("required", []))
        lines += ["| field | type | required | default | description |", "|---|---|---|---|---|"]
        for field, sub in props.items():
            default = f"`{json.dumps(sub['default'])}`" if "default" in sub else ""
            lines.append(f"| `{field}` | {type_of(sub, schemas)} | {'yes' if field in required else 'no'} | "
                         f"{_cell(default)} | {_cell(sub.get('description', ''))} |")
        lines.append("")
        extra = schema.get("additionalProperties")
        if extra is True or isinstance(extra, dict):
            lines += ["Other fields are allowed and kept.", ""]
    else:
        lines += [f"Type: {type_of(schema, schemas)}", ""]
    return lines


def render(specs: dict[str, dict[str, Any]]) -> str:
    """Markdown for the given {kind: openapi document}, grouped by family."""
    schemas = _Schemas()
    for spec in specs.values():
        schemas.add(spec)
    out: list[str] = []
    families: dict[str, list[str]] = {}
    for kind in specs:
        families.setdefault(kind.split("/", 1)[0], []).append(kind)
    for family in ("head", "resources", "agents", "models"):
        if family not in families:
            continue
        out += [f"## {FAMILY_TITLES[family]}", ""]
        for kind in families[family]:
            spec = specs[kind]
            out += [f"### `{kind}`", ""]
            description = spec.get("info", {}).get("description", "").strip()
            if description:
                out += [description, ""]
            rows, details = [], []
            for path, item in spec.get("paths", {}).items():
                if path in COMMON_PATHS:
                    continue
                methods = [m for m in _METHODS if m in item]
                # a route that accepts every method (the head's proxy) is shown once
                shown = methods[:1] if len(methods) == len(_METHODS) else methods
                for method in shown:
                    op = item[method]
                    label = "ANY" if shown != methods else method.upper()
                    rows.append(f"| {label} | `{path}` | {_cell(op.get('summary', ''))} |")
                    details += render_operation(path, label.lower() if label != "ANY" else "any", op, schemas)
            out += ["| method | path | summary |", "|---|---|---|", *rows, ""]
            out += details
    out += ["## Schemas", ""]
    if not schemas.defs:
        out += ["No endpoint declares typed request or reply models yet.", ""]
    for name in sorted(schemas.defs):
        out += render_schema(name, schemas.defs[name], schemas)
    return "\n".join(out).rstrip() + "\n"


def reference_markdown(kinds: list[str] | None = None, *, on_error: Any = None) -> str:
    """The reference for `kinds` (default: every kind). A kind that cannot be built raises,
    or with `on_error(kind, exc)` is reported there and left out."""
    specs = {}
    for kind in kinds or all_kinds():
        try:
            specs[kind] = build_openapi(kind)
        except Exception as exc:
            if on_error is None:
                raise
            on_error(kind, exc)
    return render(specs)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """MkDocs hook: fill the API reference page from the live schemas.

    A kind that cannot be built is a warning naming it (so `mkdocs build --strict` fails with
    the reason instead of a traceback); add its required options to PLACEHOLDER_OPTIONS.
    """
    if MARKER not in markdown:
        return markdown
    import logging

    log = logging.getLogger("mkdocs.hooks.apiref")

    def warn(kind: str, exc: Exception) -> None:
        log.warning("API reference: cannot build server kind %s without starting it: %s", kind, exc)

    return markdown.replace(MARKER, reference_markdown(on_error=warn))


if __name__ == "__main__":
    print(reference_markdown(), end="")
