"""Each child of `gymserve up` gets a small base environment plus the variables its own spec
references, never the launcher's whole environment (cloud credentials, other tools' tokens)."""
from __future__ import annotations

import json

from gymserve.launcher import plan
from services.core.config import load_stack


def test_children_get_the_base_set_and_what_their_spec_references(monkeypatch):
    monkeypatch.setenv("GS_TEST_UNRELATED_SECRET", "leak-me")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "leak-me-too")
    monkeypatch.setenv("GS_TEST_ANSWER_KEY", "wanted")
    monkeypatch.setenv("HF_HOME", "/srv/hf")
    stack = load_stack(base={"head": {"port": 0}, "servers": {
        "uses": {"kind": "resources/exact_match", "note": "${GS_TEST_ANSWER_KEY}"},
        "plain": {"kind": "resources/exact_match"}}})
    children = {c.name: c for c in plan(stack)}
    for child in children.values():
        assert "GS_TEST_UNRELATED_SECRET" not in child.env and "AWS_SECRET_ACCESS_KEY" not in child.env
        assert child.env["PATH"] and child.env["HF_HOME"] == "/srv/hf"
    assert children["uses"].env["GS_TEST_ANSWER_KEY"] == "wanted"
    assert "GS_TEST_ANSWER_KEY" not in children["plain"].env
    assert children["head"].env["GS_TEST_ANSWER_KEY"] == "wanted"  # the head resolves every server's options
    assert json.loads(children["uses"].env["GYMSERVE_SERVER_SPEC"]) == {"note": "${GS_TEST_ANSWER_KEY}"}
