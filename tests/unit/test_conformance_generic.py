"""The generic conformance checks against in-process apps: a conforming one passes, and a route that
ignores malformed JSON or a typed route that accepts a body missing its required field fails."""
from __future__ import annotations

import pytest
from fastapi import Request
from fastapi.testclient import TestClient
from pydantic import BaseModel

from gymserve.conformance import generic
from gymserve.conformance.probe import Probe
from gymserve.conformance.report import Report
from services.core.app import create_app, read_json
from services.core.config import ServerConfig

KEY = "unit-key"


class Question(BaseModel):
    question: str


def make_app(*, sloppy: bool):
    app = create_app(ServerConfig(name="unit", kind="head", head_url=None))

    @app.post("/typed")
    async def typed(body: Question) -> dict:
        return {"echo": body.question}

    @app.post("/by_hand")
    async def by_hand(request: Request) -> dict:
        if sloppy:
            return {"ok": True}  # never reads its body: malformed JSON gets a 200
        return {"got": await read_json(request)}

    return app


def run_generic(app) -> Report:
    report = Report("unit")
    with TestClient(app) as client:
        probe = Probe("http://testserver", KEY, http=client)
        generic.check_probes(report, probe)
        generic.check_metrics(report, probe)
        spec = generic.fetch_openapi(report, probe, "unit")
        generic.check_auth(report, probe, generic.post_paths(spec))
        generic.check_bad_bodies(report, probe, spec)
    return report


def test_a_conforming_app_passes_every_generic_check(monkeypatch) -> None:
    monkeypatch.setenv("GYMSERVE_API_KEY", KEY)
    report = run_generic(make_app(sloppy=False))
    assert report.ok, report.render()
    assert any("1 declared" in o.name for o in report.outcomes)  # the typed route's schema was held to


def test_a_route_ignoring_malformed_json_fails_bad_bodies(monkeypatch) -> None:
    monkeypatch.setenv("GYMSERVE_API_KEY", KEY)
    report = run_generic(make_app(sloppy=True))
    assert [o.name.split(":")[0] for o in report.failed] == ["bad bodies"]
    assert "POST /by_hand" in report.failed[0].detail


def test_a_typed_route_accepting_an_empty_body_fails_declared_schemas(monkeypatch) -> None:
    monkeypatch.setenv("GYMSERVE_API_KEY", KEY)
    app = make_app(sloppy=False)
    with TestClient(app) as client:
        spec = client.get("/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
        report = Report("unit")
        lying = {**spec, "paths": {**spec["paths"], "/health": {"post": spec["paths"]["/typed"]["post"]}}}
        generic.check_bad_bodies(report, Probe("http://testserver", KEY, http=client), lying)
    # /health answers GET only: a POST with `{}` is a 405, not a 4xx naming `question`
    assert not report.ok and "question" in report.failed[-1].detail


@pytest.mark.parametrize("ref, ok", [("#/components/schemas/Question", True), ("#/components/schemas/Nope", False)])
def test_refs_must_resolve(ref: str, ok: bool) -> None:
    doc = {"components": {"schemas": {"Question": {"type": "object"}}}, "x": {"$ref": ref}}
    assert all(generic.resolve(doc, r) is not None for r in generic.refs(doc)) is ok
