"""resources/workplace: tools, per-session state, and state-comparison verification.

The database/tool tests run in-process (pure functions); the server tests run a REAL
`gymserve serve resources/workplace` subprocess.
"""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from gymserve.testing import ServerProcess
from services.core.errors import BadRequest
from services.resources.workplace import tools as wp
from services.resources.workplace.app import parse_calls, replay
from services.resources.workplace.dataset import TASKS, build_rows
from services.resources.workplace.db import WorkplaceDB, diff_tables

ROWS = {row["task_id"]: row for row in build_rows()}


def row_for(request_start: str) -> dict:
    return next(r for r in ROWS.values() if r["responses_create_params"]["input"][1]["content"].startswith(request_start))


def score(row: dict, calls: list[tuple[str, dict]]) -> float:
    """Reward the environment gives a trajectory with these calls (offline replay path)."""
    seed = WorkplaceDB.from_row(row)
    expected = replay(seed.copy(), parse_calls(row["ground_truth"], "ground_truth"), strict=True)
    actual = replay(seed.copy(), calls, strict=False)
    return 0.0 if diff_tables(actual, expected) else 1.0


def truth(row: dict) -> list[tuple[str, dict]]:
    return parse_calls(row["ground_truth"], "ground_truth")


def test_dataset_has_enough_tasks_and_each_truth_scores_one():
    assert len(TASKS) >= 20
    for row in ROWS.values():
        assert row["agent_ref"]["name"] == "workplace_simple_agent"
        assert len(row["responses_create_params"]["tools"]) >= 10
        seed = WorkplaceDB.from_row(row)
        # the truth is a real task: it changes the seeded state, and its last call is needed
        assert diff_tables(replay(seed.copy(), truth(row), strict=True), seed), row["task_id"]
        assert score(row, truth(row)) == 1.0
        assert score(row, truth(row)[:-1]) == 0.0, row["task_id"]  # stopping one call short fails
        assert score(row, []) == 0.0  # doing nothing never passes


def test_equivalent_sequences_score_one():
    carla = row_for("Reassign all of Carla")
    reordered = list(reversed(truth(carla)))
    with_reads = [("search_tasks", {"assigned_to_email": "carla", "status": "backlog"})] + reordered + \
                 [("list_projects", {})]
    assert score(carla, with_reads) == 1.0
    # the same end state by a detour: a wrong value first, then corrected
    detour = [("update_task", {"task_id": "T006", "assigned_to_email": "bob.martinez@lumen.io"})] + truth(carla)
    assert score(carla, detour) == 1.0

    litware = row_for("Add the note")
    split = [("update_customer", {"customer_id": "C007", "follow_up_by": "2024-03-26"}),
             ("update_customer", {"customer_id": "C007", "notes": "Prefers email contact"})]
    assert score(litware, split) == 1.0

    brand = row_for("Set up a 45-minute")
    # other formats for the same values, other order; generated ids differ
    variant = [("send_email", {"recipient": "Grace.Liu@Lumen.io", "subject": "Brand review",
                               "body": "Booked Friday 15:00 to review the brand refresh."}),
               ("create_event", {"event_name": "Brand review", "participant_email": "GRACE.LIU@lumen.io",
                                 "event_start": "2024-03-22T15:00", "duration": "45"})]
    assert score(brand, variant) == 1.0

    sync = row_for("Move Monday")
    recreate_is_not_update = [("delete_event", {"event_id": "EV001"}),
                              ("create_event", {"event_name": "Team sync", "participant_email": "bob.martinez@lumen.io",
                                                "event_start": "2024-03-18 11:00:00", "duration": 30})]
    assert score(sync, recreate_is_not_update) == 0.0  # the original event (its id) is gone


def test_wrong_sequences_score_zero():
    carla = row_for("Reassign all of Carla")
    assert score(carla, truth(carla)[:2]) == 0.0  # one task missed
    wrong_person = [(n, {**a, "assigned_to_email": "hiro.tanaka@lumen.io"}) for n, a in truth(carla)]
    assert score(carla, wrong_person) == 0.0
    too_much = truth(carla) + [("delete_email", {"email_id": "EM009"})]
    assert score(carla, too_much) == 0.0
    budget = row_for("Make the budget review")
    assert score(budget, [("update_event", {"event_id": "EV002", "duration": 60 + 15})]) == 0.0


def test_bad_arguments_name_the_problem():
    db = WorkplaceDB.from_row({})
    cases = [
        ("create_event", {"event_name": "x", "participant_email": "not-an-email", "event_start": "2024-03-18 10:00",
                          "duration": 30}, "participant_email"),
        ("create_event", {"event_name": "x", "participant_email": "a@b.io", "event_start": "tomorrow",
                          "duration": 30}, "event_start"),
        ("update_task", {"task_id": "T001", "status": "Doing"}, "status"),
        ("update_task", {"task_id": "T999", "status": "Completed"}, "T999"),
        ("update_task", {"task_id": "T001"}, "nothing to update"),
        ("create_task", {"task_name": "x", "project": "Moonshot", "assigned_to_email": "bob.martinez@lumen.io",
                         "due_date": "2024-04-01"}, "Moonshot"),
        ("add_customer", {"customer_name": "X", "assigned_to_email": "stranger@else.example"}, "not an employee"),
        ("search_emails", {"qeury": "budget"}, "qeury"),
        ("no_such_tool", {}, "unknown tool"),
    ]
    before = db.canonical()
    for name, args, needle in cases:
        with pytest.raises(BadRequest) as info:
            wp.call(db, name, args)
        assert needle in info.value.message, (name, info.value.message)
    assert db.canonical() == before  # failed calls change nothing


def test_seed_from_row_initial_state_and_updates():
    row = {"initial_state": {"customers": [{"customer_id": "Z1", "customer_name": "Only", "customer_email": None,
                                            "assigned_to_email": "emma.novak@lumen.io", "status": "Lead",
                                            "product_interest": "Software"}]},
           "state_updates": {"tasks": [{"task_id": "T001", "status": "Completed"}]}}
    db = WorkplaceDB.from_row(row)
    assert [c["customer_id"] for c in db.rows("customers")] == ["Z1"]
    assert db.get("tasks", "T001")["status"] == "Completed"
    assert db.get("tasks", "T001")["task_name"] == "Build landing page"
    with pytest.raises(BadRequest, match="unknown table"):
        WorkplaceDB.from_row({"initial_state": {"invoices": []}})
    with pytest.raises(BadRequest, match="task_id"):
        WorkplaceDB.from_row({"state_updates": {"tasks": [{"status": "Completed"}]}})


# ---------------------------------------------------------------------------- #
# The real server
# ---------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def server():
    with ServerProcess("resources/workplace") as proc:
        yield proc


def _response_with_calls(calls: list[tuple[str, dict]]) -> dict:
    output = [{"type": "function_call", "call_id": f"c{i}", "name": n, "arguments": json.dumps(a)}
              for i, (n, a) in enumerate(calls)]
    output.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]})
    return {"output": output}


def test_server_tools_and_verify_with_session(server):
    row = row_for("Reassign all of Carla")
    sid = server.post("/seed_session", row).json()["session_id"]
    hdr = {"X-Session-Id": sid}
    found = server.post("/search_tasks", {"assigned_to_email": "carla", "status": "Backlog"}, headers=hdr).json()
    assert sorted(t["task_id"] for t in found) == ["T006", "T009", "T010"]
    bad = server.post("/update_task", {"task_id": "T006", "status": "Sideways"}, headers=hdr)
    assert bad.status_code == 400 and "status" in bad.json()["detail"]
    missing = server.post("/update_task", {"task_id": "T404", "status": "Completed"}, headers=hdr)
    assert missing.status_code == 400 and "T404" in missing.json()["detail"]
    no_session = server.post("/search_tasks", {})
    assert 400 <= no_session.status_code < 500
    for task_id in ("T010", "T006"):
        r = server.post("/update_task", {"task_id": task_id, "assigned_to_email": "emma.novak@lumen.io"}, headers=hdr)
        assert r.status_code == 200, r.text
    body = {**row, "response": _response_with_calls([])}
    partial = server.post("/verify", body, headers=hdr).json()
    assert partial["reward"] == 0.0 and partial["mismatched_tables"] == ["tasks"]
    server.post("/update_task", {"task_id": "T009", "assigned_to_email": "Emma.Novak@lumen.io"}, headers=hdr)
    done = server.post("/verify", body, headers=hdr).json()
    assert done["reward"] == 1.0 and done["state_source"] == "session" and not done.get("mask_sample")
    assert server.post("/close_session", headers=hdr).json()["closed"] is True
    schemas = server.get("/tools").json()
    assert len(schemas) >= 10 and all(s["type"] == "function" and "parameters" in s for s in schemas)


def test_server_verify_without_session_replays_the_trajectory(server):
    row = row_for("Delete every Tech Digest")
    good = server.post("/verify", {**row, "response": _response_with_calls(truth(row))}).json()
    assert good["reward"] == 1.0 and good["state_source"] == "replay"
    bad = server.post("/verify", {**row, "response": _response_with_calls(truth(row)[:1])}).json()
    assert bad["reward"] == 0.0
    no_truth = server.post("/verify", {"responses_create_params": row["responses_create_params"],
                                       "response": _response_with_calls([])})
    assert no_truth.status_code == 400 and "ground_truth" in no_truth.json()["detail"]
    bad_seed = server.post("/seed_session", {**row, "initial_state": {"invoices": []}})
    assert bad_seed.status_code == 400 and "invoices" in bad_seed.json()["detail"]


async def test_concurrent_sessions_are_isolated(server):
    """40 sessions at once, each deleting a different email: every session sees only its own change."""
    emails = [f"EM{i:03d}" for i in range(1, 11)]

    async def one(client: httpx.AsyncClient, k: int) -> tuple[int, list[str]]:
        sid = (await client.post("/seed_session", json={})).json()["session_id"]
        hdr = {"X-Session-Id": sid}
        target = emails[k % len(emails)]
        await asyncio.sleep(0)
        r = await client.post("/delete_email", json={"email_id": target}, headers=hdr)
        assert r.status_code == 200, r.text
        left = (await client.post("/search_emails", json={"limit": 50}, headers=hdr)).json()
        await client.post("/close_session", headers=hdr)
        return k, sorted(m["email_id"] for m in left)

    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        results = await asyncio.gather(*(one(client, k) for k in range(40)))
    for k, left in results:
        assert left == sorted(set(emails) - {emails[k % len(emails)]})


def test_verify_can_close_the_session(server):
    """`X-Close-Session: 1` on /verify (what agents send) judges the live state, then closes the session."""
    row = row_for("Cancel the vendor call")
    sid = server.post("/seed_session", row).json()["session_id"]
    hdr = {"X-Session-Id": sid}
    assert server.post("/delete_event", {"event_id": "EV004"}, headers=hdr).status_code == 200
    r = server.post("/verify", {**row, "response": _response_with_calls([])}, headers={**hdr, "X-Close-Session": "1"})
    assert r.json()["reward"] == 1.0 and r.json()["state_source"] == "session"
    assert r.headers.get("x-close-session") == "1"
    assert server.post("/search_events", {}, headers=hdr).status_code == 409
    kept = server.post("/seed_session", row).json()["session_id"]
    server.post("/verify", {**row, "response": _response_with_calls([])}, headers={"X-Session-Id": kept})
    assert server.post("/search_events", {}, headers={"X-Session-Id": kept}).status_code == 200  # no header: kept


def test_directory_reply_forward_and_deletes_change_exactly_what_they_name():
    """The tools no dataset task uses yet: each one's result and its effect on the state."""
    db = WorkplaceDB.from_row({})
    carla = next(e for e in db.rows("employees") if e["email"] == "carla.rossi@lumen.io")
    assert wp.call(db, "find_email_address", {"name": "carla"}) == [
        {"name": "Carla Rossi", "email": "carla.rossi@lumen.io", "title": carla["title"]}]
    found = wp.call(db, "find_email_address", {"name": "ROSSI"})
    assert [e["email"] for e in found] == ["carla.rossi@lumen.io"]
    assert wp.call(db, "find_email_address", {"name": "nobody-here"}) == []

    emails = len(db.rows("emails"))
    reply = wp.call(db, "reply_email", {"email_id": "EM001", "body": " Numbers attached. "})
    sent = db.get("emails", reply["email_id"])
    assert (sent["folder"], sent["sender"], sent["recipient"], sent["subject"], sent["body"]) == (
        "sent", "alice.chen@lumen.io", "carla.rossi@lumen.io", "Re: Q1 budget review", "Numbers attached.")
    again = db.get("emails", wp.call(db, "reply_email", {"email_id": reply["email_id"], "body": "x"})["email_id"])
    assert again["subject"] == "Re: Q1 budget review"  # no "Re: Re: "
    fwd = db.get("emails", wp.call(db, "forward_email", {"email_id": "EM001",
                                                         "recipient": "bob.martinez@lumen.io"})["email_id"])
    original = db.get("emails", "EM001")
    assert (fwd["recipient"], fwd["subject"], fwd["body"]) == (
        "bob.martinez@lumen.io", "Fwd: Q1 budget review", original["body"])
    assert len(db.rows("emails")) == emails + 3

    tasks = {t["task_id"] for t in db.rows("tasks")}
    assert wp.call(db, "delete_task", {"task_id": "T001"}) == {"status": "deleted", "task_id": "T001"}
    assert {t["task_id"] for t in db.rows("tasks")} == tasks - {"T001"}

    owned = wp.call(db, "search_customers", {"assigned_to_email": "emma.novak"})
    assert owned and all(c["assigned_to_email"] == "emma.novak@lumen.io" for c in owned)
    assert [c["customer_id"] for c in owned] == sorted(c["customer_id"] for c in owned)
    assert [c["customer_id"] for c in wp.call(db, "search_customers", {"customer_name": "northwind"})] == ["C001"]
    proposal = wp.call(db, "search_customers", {"status": "Proposal", "product_interest": "Software"})
    assert "C001" in {c["customer_id"] for c in proposal}
    assert all((c["status"], c["product_interest"]) == ("Proposal", "Software") for c in proposal)
    assert wp.call(db, "delete_customer", {"customer_id": "C001"}) == {"status": "deleted", "customer_id": "C001"}
    assert wp.call(db, "search_customers", {"customer_name": "northwind"}) == []


@pytest.mark.parametrize("name,args,needle", [
    ("reply_email", {"email_id": "EM999", "body": "x"}, "EM999"),
    ("forward_email", {"email_id": "EM001", "recipient": "not-an-email"}, "recipient"),
    ("delete_task", {"task_id": "T999"}, "T999"),
    ("delete_customer", {"customer_id": "C999"}, "C999"),
    ("search_customers", {"status": "Happy"}, "status"),
    ("find_email_address", {}, "name"),
])
def test_untouched_tools_reject_bad_arguments_by_name(name, args, needle):
    db = WorkplaceDB.from_row({})
    before = db.canonical()
    with pytest.raises(BadRequest, match=needle):
        wp.call(db, name, args)
    assert db.canonical() == before


def test_idle_sessions_expire_after_session_ttl_s():
    """`session_ttl_s`: a session idle longer is dropped (409 naming it); one in use stays alive."""
    import time

    with ServerProcess("resources/workplace", "session_ttl_s=1.5") as proc:
        idle = proc.post("/seed_session", {}).json()["session_id"]
        busy = proc.post("/seed_session", {}).json()["session_id"]
        assert proc.post("/delete_email", {"email_id": "EM001"}, headers={"X-Session-Id": busy}).status_code == 200
        for _ in range(6):  # 3 s of use, each call well inside the ttl
            time.sleep(0.5)
            assert proc.post("/search_emails", {}, headers={"X-Session-Id": busy}).status_code == 200
        gone = proc.post("/search_emails", {}, headers={"X-Session-Id": idle})
        assert gone.status_code == 409 and idle in gone.json()["detail"] and "expired" in gone.json()["detail"]
        kept = proc.post("/search_emails", {"limit": 50}, headers={"X-Session-Id": busy}).json()
        assert "EM001" not in {m["email_id"] for m in kept}  # the busy session kept its state
