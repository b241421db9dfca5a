"""resources/workplace_assistant as a real server: per-session databases that tools change, NeMo-Gym's
verification (right, equivalent and wrong trajectories) and 4xx replies that name the bad field."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymserve.testing import ServerProcess
from services.resources.workplace_assistant.tools import Workspace

ROWS = [json.loads(line) for line in
        (Path(__file__).resolve().parents[2] / "datasets" / "workplace_assistant" / "example.jsonl").read_text()
        .splitlines()]


@pytest.fixture(scope="module")
def server():
    with ServerProcess("resources/workplace_assistant") as proc:
        yield proc


def seeded(server: ServerProcess) -> dict[str, str]:
    reply = server.post("/seed_session", ROWS[0])
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["tools"]) == 27
    assert [t["name"] for t in server.get("/tools").json()] == reply.json()["tools"]
    return {"X-Session-Id": reply.json()["session_id"]}


def body(row: dict, calls: list[dict]) -> dict:
    output = [{"type": "function_call", "call_id": f"c{i}", "name": c["name"], "arguments": c["arguments"]}
              for i, c in enumerate(calls)]
    return {**row, "response": {"id": "r", "output": output}}


def test_tools_change_the_sessions_own_database(server):
    alice, bob = seeded(server), seeded(server)
    sent = server.post("/email_send_email", {"recipient": "Raj.Patel@atlas.com", "subject": "Zephyr offsite",
                                             "body": "Draft attached"}, headers=alice)
    assert sent.json() == {"output": "Email sent successfully."}
    found = server.post("/email_search_emails", {"query": "zephyr offsite"}, headers=alice).json()["output"]
    assert found["emails"][0]["sender/recipient"] == "raj.patel@atlas.com"
    assert found["emails"][0]["inbox/outbox"] == "outbox"
    assert server.post("/email_search_emails", {"query": "zephyr offsite"}, headers=bob).json() == \
        {"output": "No emails found."}
    deleted = server.post("/customer_relationship_manager_delete_customer", {"customer_id": "00000009"}, headers=bob)
    assert deleted.json() == {"output": "Customer deleted successfully."}
    again = server.post("/customer_relationship_manager_delete_customer", {"customer_id": "00000009"}, headers=bob)
    assert again.json() == {"output": "Customer not found."}  # a tool's own refusal is output for the model


def test_the_database_is_nemo_gyms_size():
    w = Workspace()
    assert [len(t) for t in (w.emails, w.events, w.tasks, w.customers, w.visits)] == [500, 300, 300, 200, 1000]


def test_tool_results_are_json_with_nulls_for_missing_values(server):
    found = server.post("/customer_relationship_manager_search_customers", {"customer_name": "Taylor Jackson"},
                        headers=seeded(server)).json()["output"]
    assert found["customers"][0]["customer_phone"] is None
    counts = server.post("/analytics_total_visits_count", {"time_min": "2023-11-29"}, headers=seeded(server)).json()
    assert set(counts["output"]) == {"2023-11-29", "2023-11-30"} and all(isinstance(v, int)
                                                                          for v in counts["output"].values())


@pytest.mark.parametrize("row", ROWS, ids=[str(r["id"]) for r in ROWS])
def test_ground_truth_scores_one_and_other_trajectories_zero(server, row):
    truth = row["ground_truth"]
    right = server.post("/verify", body(row, truth)).json()
    assert right["reward"] == 1.0 and right["mismatched_tables"] == []
    nothing = server.post("/verify", body(row, [])).json()
    assert nothing["reward"] == 0.0 and nothing["mismatched_tables"]
    shuffled = server.post("/verify", body(row, list(reversed(truth)))).json()
    assert shuffled["reward"] == 1.0  # independent changes in another order leave the same state
    lookups = [{"name": "company_directory_find_email_address", "arguments": '{"name": "carlos"}'},
               {"name": "email_search_emails", "arguments": '{"query": "update"}'}]
    assert server.post("/verify", body(row, lookups + truth)).json()["reward"] == 1.0
    batch = server.post("/verify/batch", [body(row, truth), body(row, [])]).json()
    assert [r["reward"] for r in batch] == [1.0, 0.0]  # without a session: the same replay


def test_a_wrong_value_scores_zero_and_names_the_table(server):
    row = ROWS[1]  # calendar_update_event on event 00000252
    args = json.loads(row["ground_truth"][0]["arguments"])
    wrong = [{"name": row["ground_truth"][0]["name"], "arguments": json.dumps({**args, "new_value": "Other"})}]
    reply = server.post("/verify", body(row, wrong)).json()
    assert reply["reward"] == 0.0 and reply["mismatched_tables"] == ["calendar"]
    recased = [{"name": row["ground_truth"][0]["name"],
                "arguments": json.dumps({**args, "new_value": args["new_value"].upper()})}]
    assert server.post("/verify", body(row, recased)).json()["reward"] == 1.0  # names compare case-insensitively


def test_bad_input_is_a_4xx_naming_the_field(server):
    headers = seeded(server)
    missing = server.post("/email_send_email", {"recipient": "a@b.com", "subject": "x"}, headers=headers)
    assert missing.status_code == 400 and "body" in missing.text
    unknown = server.post("/email_delete_email", {"email_id": "00000001", "colour": "red"}, headers=headers)
    assert unknown.status_code == 400 and "colour" in unknown.text
    assert server.post("/email_delete_email", {"email_id": None}, headers=headers).json() == \
        {"output": "Email ID not provided."}  # null counts as not given: the tool says what is missing
    gone = server.post("/email_delete_email", {"email_id": "00000001"}, headers={"X-Session-Id": "no-such-session"})
    assert gone.status_code == 409
    no_session = server.post("/email_delete_email", {"email_id": "00000001"})
    assert 400 <= no_session.status_code < 500 and "session" in no_session.text
    for truth, where in (("not a list", "ground_truth"), ([{"name": "x", "arguments": {}}], "ground_truth[0]")):
        bad = server.post("/verify", {**body(ROWS[0], []), "ground_truth": truth})
        assert bad.status_code == 400 and where in bad.text, bad.text
    absent = server.post("/verify", {k: v for k, v in body(ROWS[0], []).items() if k != "ground_truth"})
    assert absent.status_code == 400 and "ground_truth" in absent.text
