"""What every gymserve server must do, whatever its kind: probes, metrics, auth, OpenAPI, bad bodies.

The OpenAPI checks read what the server declares: a request body schema with required fields
must refuse `{}`, an object schema must refuse a list. Servers that declare typed bodies are thus
held to them without this checker knowing their models.
"""
from __future__ import annotations

from typing import Any

from .probe import Probe, error_message
from .report import Report, expect

# Paths each kind must declare in its OpenAPI document.
REQUIRED_PATHS = {
    "resources": ["/seed_session", "/verify", "/verify/batch", "/aggregate_metrics", "/close_session"],
    "agents": ["/run", "/v1/responses", "/aggregate_metrics"],
    "models": ["/v1/responses", "/v1/models"],
    "head": ["/server_instances", "/global_config_dict_yaml"],
}
MALFORMED_JSON = b'{"responses_create_params": {"input": '  # cut off mid-object


def check_probes(report: Report, probe: Probe) -> None:
    with report.check("liveness: GET / and /health answer {\"status\": \"ok\"} without a token"):
        for path in ("/", "/health"):
            r = probe.get(path, anonymous=True)
            expect(r.status_code == 200 and r.json() == {"status": "ok"},
                   f"GET {path}: {r.status_code} {r.text[:120]}")
    with report.check("readiness: GET /ready is 200 once started, without a token"):
        r = probe.get("/ready", anonymous=True)
        expect(r.status_code == 200, f"GET /ready: {r.status_code} {r.text[:120]}")
    with report.check("request ids: replies carry X-Request-Id, a given one is echoed"):
        r = probe.get("/health", headers={"X-Request-Id": "check-123"})
        expect(r.headers.get("x-request-id") == "check-123", f"X-Request-Id: {r.headers.get('x-request-id')!r}")


def check_metrics(report: Report, probe: Probe) -> None:
    with report.check("metrics: GET /metrics is Prometheus text with request counts"):
        r = probe.get("/metrics")
        expect(r.status_code == 200, f"GET /metrics: {r.status_code}")
        expect("text/plain" in r.headers.get("content-type", ""), f"content-type {r.headers.get('content-type')}")
        for name in ("gymserve_requests_total", "gymserve_requests_in_flight", "gymserve_request_duration_seconds"):
            expect(name in r.text, f"/metrics lacks {name}")


def check_auth(report: Report, probe: Probe, post_paths: list[str]) -> None:
    with report.check("auth: without the bearer token /metrics, /openapi.json and POST routes are 401"):
        expect(probe.key, "the checker must run the server with GYMSERVE_API_KEY set")
        for path in ("/metrics", "/openapi.json"):
            for key in ("", "wrong-" + str(probe.key)):
                r = probe.get(path, key=key) if key else probe.get(path, anonymous=True)
                expect(r.status_code == 401, f"GET {path} with {'a wrong' if key else 'no'} token: {r.status_code}")
        for path in post_paths:
            r = probe.post(path, {}, anonymous=True)
            expect(r.status_code == 401, f"POST {path} without a token: {r.status_code}")
            expect(error_message(r), f"POST {path} 401 has no message")


def fetch_openapi(report: Report, probe: Probe, family: str) -> dict[str, Any] | None:
    spec: dict[str, Any] | None = None
    with report.check("openapi: /openapi.json is a well-formed OpenAPI 3 document with the kind's paths"):
        r = probe.get("/openapi.json")
        expect(r.status_code == 200, f"GET /openapi.json: {r.status_code}")
        doc = r.json()
        expect(isinstance(doc, dict) and str(doc.get("openapi", "")).startswith("3."), "no `openapi: 3.x` field")
        expect(isinstance(doc.get("info"), dict) and doc["info"].get("title"), "no info.title")
        paths = doc.get("paths")
        expect(isinstance(paths, dict) and paths, "no paths")
        missing = [p for p in ["/health", "/ready", *REQUIRED_PATHS.get(family, [])] if p not in paths]
        expect(not missing, f"paths missing: {', '.join(missing)}")
        unresolved = [ref for ref in refs(doc) if resolve(doc, ref) is None]
        expect(not unresolved, f"unresolvable $ref: {', '.join(sorted(set(unresolved))[:5])}")
        spec = doc
    return spec


def post_paths(spec: dict[str, Any] | None) -> list[str]:
    """POST routes without path parameters (those are proxies or catch-alls)."""
    if not spec:
        return []
    return sorted(p for p, ops in spec.get("paths", {}).items() if "post" in ops and "{" not in p)


def check_bad_bodies(report: Report, probe: Probe, spec: dict[str, Any] | None) -> None:
    paths = post_paths(spec)
    with report.check(f"bad bodies: malformed JSON is a 4xx with a message on every POST route ({len(paths)})"):
        expect(paths, "no POST routes to check")
        for path in paths:
            r = probe.post(path, content=MALFORMED_JSON)
            expect(400 <= r.status_code < 500, f"POST {path} with malformed JSON: {r.status_code} {r.text[:120]}")
            expect(error_message(r), f"POST {path} malformed JSON: {r.status_code} without a message")
    declared = {p: s for p in paths if (s := _body_schema(spec or {}, p)) is not None}
    with report.check(f"declared schemas: bodies violating a declared request schema are a 4xx naming the field "
                      f"({len(declared)} declared)"):
        for path, schema in declared.items():
            required = [f for f in schema.get("required", []) if isinstance(f, str)]
            if required:
                r = probe.post(path, {})
                expect(400 <= r.status_code < 500, f"POST {path} {{}} (requires {required}): {r.status_code}")
                message = error_message(r)
                expect(any(f in message for f in required), f"POST {path} {{}}: message {message[:120]!r} "
                                                             f"names none of {required}")
            if schema.get("type") == "object":
                r = probe.post(path, [1, 2])
                expect(400 <= r.status_code < 500, f"POST {path} with a list for an object: {r.status_code}")
                expect(error_message(r), f"POST {path} list body: no message")


def _body_schema(spec: dict[str, Any], path: str) -> dict[str, Any] | None:
    body = spec["paths"][path]["post"].get("requestBody") or {}
    schema = ((body.get("content") or {}).get("application/json") or {}).get("schema")
    if not isinstance(schema, dict):
        return None
    if "$ref" in schema:
        schema = resolve(spec, schema["$ref"])
    return schema if isinstance(schema, dict) and schema else None


def refs(node: Any) -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            out.append(ref)
        for value in node.values():
            out += refs(value)
    elif isinstance(node, list):
        for value in node:
            out += refs(value)
    return out


def resolve(doc: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#/"):
        return None
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node

