"""workplace_assistant against NeMo-Gym 0.7.0's own workplace_assistant server.

1. Rewards: every NeMo-Gym example row, with its ground-truth calls replayed, with wrong,
   partial, reordered, re-cased, malformed and extra-call trajectories, and with every response
   NeMo-Gym's recorded rollouts hold, goes to both `/verify`s; the rewards must be equal.
2. Tool results: one long sequence of calls over all 27 tools (reads, writes, bad arguments) runs
   in a NeMo-Gym tool environment and in one of our sessions over HTTP; every result must be equal.

NeMo-Gym's side runs its `WorkbenchResourcesServer.verify` and its tool functions in its own
virtualenv, in one process.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gymserve.testing import ServerProcess
from tests.compat.compat_page import compared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first compat test may install NeMo-Gym

ROWS = Path(__file__).resolve().parents[2] / "datasets" / "workplace_assistant" / "example.jsonl"

NEMO_VERIFY = """
import asyncio, types
from nemo_gym.server_utils import SESSION_ID_KEY
from resources_servers.workplace_assistant.app import (WorkbenchResourcesServer, WorkbenchResourcesServerConfig,
                                                       WorkbenchVerifyRequest)
config = WorkbenchResourcesServerConfig(host="127.0.0.1", port=1, entrypoint="app.py", name="workplace_assistant")
server = WorkbenchResourcesServer.model_construct(config=config, session_id_to_tool_env={})
request = types.SimpleNamespace(session={SESSION_ID_KEY: "s"})
async def main():
    return [(await server.verify(request, WorkbenchVerifyRequest.model_validate(b))).reward for b in data]
print(json.dumps(asyncio.run(main())))
"""

NEMO_TOOLS = """
import math
import numpy as np
from resources_servers.workplace_assistant.utils import get_tools
env = get_tools(["email", "calendar", "analytics", "project_management", "customer_relationship_manager"])
def plain(v):
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, np.generic):
        v = v.item()
    return None if isinstance(v, float) and math.isnan(v) else v
out = []
for name, args in data:
    args = {k: v for k, v in args.items() if v is not None}
    try:
        out.append(plain(env["functions"][name](**args)))
    except Exception as e:
        out.append(f"Error executing tool '{name}': {e}")
print(json.dumps(out))
"""


def _call(tool: str, **arguments) -> dict:
    return {"name": tool, "arguments": json.dumps(arguments)}


def _response(calls: list[dict]) -> dict:
    output = [{"type": "function_call", "call_id": f"call_{i}", "id": f"fc_{i}", "status": "completed",
               "name": c["name"], "arguments": c["arguments"]} for i, c in enumerate(calls)]
    output.append({"type": "message", "id": "msg_x", "role": "assistant", "status": "completed",
                   "content": [{"type": "output_text", "text": "Done.", "annotations": []}]})
    return {"id": "resp_x", "object": "response", "created_at": 1.0, "model": "policy", "status": "completed",
            "output": output, "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}


def _recased(call: dict) -> dict:
    args = json.loads(call["arguments"])
    return {"name": call["name"], "arguments": json.dumps({k: v.upper() if isinstance(v, str) else v
                                                           for k, v in args.items()})}


def _trajectories(truth: list[dict]) -> list[list[dict]]:
    """Right, equivalent and wrong ways to answer a row."""
    first = json.loads(truth[0]["arguments"])
    id_key = next(k for k in first if k.endswith("_id"))
    return [
        truth,                                                        # the ground truth itself
        [],                                                           # nothing done
        truth[:-1],                                                   # one call short
        list(reversed(truth)),                                        # another order
        truth + truth,                                                # every call twice
        [_recased(c) for c in truth],                                 # values in upper case
        [_call("company_directory_find_email_address", name="raj"),
         _call("email_search_emails", query="update"), *truth],       # look-ups first
        [*truth, _call("email_delete_email", email_id="00000001")],  # one extra change
        [{"name": truth[0]["name"], "arguments": json.dumps({**first, id_key: "99999999"})}, *truth[1:]],
        [{"name": truth[0]["name"], "arguments": "{not json"}, *truth[1:]],
        [{"name": "no_such_tool", "arguments": "{}"}, *truth],
        [{"name": truth[0]["name"], "arguments": json.dumps({**first, "extra": 1})}, *truth[1:]],
        [*truth, _call("analytics_create_plot", time_min="2023-11-01", time_max="2023-11-30",
                       value_to_plot="total_visits", plot_type="bar")],
        [*truth, _call("calendar_create_event", event_name="Sync", participant_email="Raj.Patel@atlas.com",
                       event_start="2023-12-01 10:00:00", duration="30")],
        [*truth, _call("project_management_create_task", task_name="Fix login", list_name="Backlog",
                       assigned_to_email="raj.patel@atlas.com", due_date="2023-12-08", board="Back end")],
        [*truth, _call("customer_relationship_manager_add_customer", customer_name="Ada",
                       assigned_to_email="raj.patel@atlas.com", status="Lead")],
        [*truth, _call("project_management_update_task", task_id="00000149", field="board", new_value="backend")],
    ]


def _recorded(nemo) -> list[dict]:
    [found] = list(nemo.venv.glob("lib/python3.*/site-packages/resources_servers/workplace_assistant/data"))
    return [json.loads(line) for line in (found / "example_rollouts.jsonl").read_text().splitlines()]


def test_rewards_equal_nemo_gyms_on_its_rows(nemo, workdir):
    rows = [json.loads(line) for line in ROWS.read_text().splitlines()]
    recorded = _recorded(nemo)
    generated = [{**row, "response": _response(calls)} for row in rows for calls in _trajectories(row["ground_truth"])]
    # every response NeMo-Gym recorded (for tasks whose rows it does not ship), judged against every row
    replayed = [{**row, "response": rollout["response"]} for rollout in recorded for row in rows]
    bodies = generated + replayed
    theirs = nemo.python_json(NEMO_VERIFY, bodies, workdir)
    with ServerProcess("resources/workplace_assistant") as server:
        ours = [server.post("/verify", body).json()["reward"] for body in bodies]
    differ = [(i, bodies[i]["response"]["output"][:-1], ours[i], theirs[i])
              for i in range(len(bodies)) if ours[i] != theirs[i]]
    assert not differ, f"{len(differ)} of {len(bodies)} rewards differ: {differ[:5]}"
    per_row = len(generated) // len(rows)
    assert all(ours[i * per_row] == 1.0 and ours[i * per_row + 1] == 0.0 for i in range(len(rows)))
    assert 0 < sum(ours) < len(ours)
    assert len(replayed) == 25
    compared("workplace_assistant", len(bodies))

TOOL_CALLS: list[tuple[str, dict]] = [
    ("company_directory_find_email_address", {"name": "Carlos"}),
    ("company_directory_find_email_address", {"name": ""}),
    ("email_search_emails", {"query": "task update", "page": 2}),
    ("email_search_emails", {"query": "budget", "date_min": "2023-11-01", "date_max": "2023-11-15", "page_size": 3}),
    ("email_search_emails", {"query": "zzzz-nothing"}),
    ("email_get_email_information_by_id", {"email_id": "00000057", "field": "subject"}),
    ("email_get_email_information_by_id", {"email_id": "00000057", "field": "colour"}),
    ("email_get_email_information_by_id", {"email_id": "12345678", "field": "body"}),
    ("email_send_email", {"recipient": "Raj.Patel@atlas.com", "subject": "Hi", "body": "Hello"}),
    ("email_send_email", {"recipient": "not-an-address", "subject": "Hi", "body": "Hello"}),
    ("email_reply_email", {"email_id": "00000057", "body": "Thanks"}),
    ("email_forward_email", {"email_id": "00000057", "recipient": "lena.schmidt@atlas.com"}),
    ("email_delete_email", {"email_id": "00000057"}),
    ("email_delete_email", {"email_id": "00000057"}),
    ("email_search_emails", {"query": "thanks"}),
    ("calendar_search_events", {"query": "review", "time_min": "2023-11-01 00:00:00"}),
    ("calendar_search_events", {"query": "sync", "time_max": "not a time"}),
    ("calendar_get_event_information_by_id", {"event_id": "00000013", "field": "event_name"}),
    ("calendar_get_event_information_by_id", {"event_id": "13", "field": "event_name"}),
    ("calendar_create_event", {"event_name": "Sync", "participant_email": "Raj.Patel@atlas.com",
                               "event_start": "2023-12-01 10:00:00", "duration": "30"}),
    ("calendar_create_event", {"event_name": "Sync", "participant_email": "raj.patel@atlas.com",
                               "event_start": "2023-12-01 10:00:00", "duration": "-5"}),
    ("calendar_update_event", {"event_id": "00000013", "field": "duration", "new_value": "45"}),
    ("calendar_update_event", {"event_id": "00000013", "field": "colour", "new_value": "red"}),
    ("calendar_delete_event", {"event_id": "00000275"}),
    ("calendar_search_events", {"query": "sync"}),
    ("analytics_get_visitor_information_by_id", {"visitor_id": "0860"}),
    ("analytics_get_visitor_information_by_id", {"visitor_id": "nobody"}),
    ("analytics_total_visits_count", {"time_min": "2023-11-20", "time_max": "2023-11-25"}),
    ("analytics_engaged_users_count", {"time_min": "2023-11-20"}),
    ("analytics_traffic_source_count", {"time_min": "2023-11-20", "traffic_source": "direct"}),
    ("analytics_traffic_source_count", {"time_max": "2023-10-05"}),
    ("analytics_get_average_session_duration", {"time_min": "2023-11-25"}),
    ("analytics_create_plot", {"time_min": "2023-11-01", "time_max": "2023-11-30", "value_to_plot": "total_visits",
                               "plot_type": "bar"}),
    ("analytics_create_plot", {"time_min": "2023-11-01", "time_max": "2023-11-30", "value_to_plot": "sales",
                               "plot_type": "bar"}),
    ("project_management_search_tasks", {"assigned_to_email": "carlos.rodriguez@atlas.com", "board": "back"}),
    ("project_management_search_tasks", {"assigned_to_email": "carlos"}),
    ("project_management_search_tasks", {}),
    ("project_management_get_task_information_by_id", {"task_id": "00000149", "field": "board"}),
    ("project_management_create_task", {"task_name": "Fix login", "assigned_to_email": "Carlos.Rodriguez@atlas.com",
                                        "list_name": "Backlog", "due_date": "2023-12-08", "board": "Back end"}),
    ("project_management_create_task", {"task_name": "Fix login", "assigned_to_email": "nobody@atlas.com",
                                        "list_name": "Backlog", "due_date": "2023-12-08", "board": "Back end"}),
    ("project_management_update_task", {"task_id": "00000149", "field": "list_name", "new_value": "In Review"}),
    ("project_management_update_task", {"task_id": "00000149", "field": "board", "new_value": "backend"}),
    ("project_management_delete_task", {"task_id": "00000037"}),
    ("project_management_search_tasks", {"task_name": "login"}),
    ("customer_relationship_manager_search_customers", {"customer_name": "taylor", "page": 3}),
    ("customer_relationship_manager_search_customers", {"status": "Won", "follow_up_by_max": "2023-12-10"}),
    ("customer_relationship_manager_search_customers", {}),
    ("customer_relationship_manager_add_customer", {"customer_name": "Ada", "assigned_to_email": "Raj.Patel@atlas.com",
                                                    "status": "Lead", "customer_email": "ADA@x.com"}),
    ("customer_relationship_manager_update_customer", {"customer_id": "00000189", "field": "status",
                                                       "new_value": "Won"}),
    ("customer_relationship_manager_update_customer", {"customer_id": "00000189", "field": "status",
                                                       "new_value": "won"}),
    ("customer_relationship_manager_delete_customer", {"customer_id": "00000107"}),
    ("customer_relationship_manager_search_customers", {"customer_name": "ada"}),
]


def test_tool_results_equal_nemo_gyms(nemo, workdir):
    theirs = nemo.python_json(NEMO_TOOLS, TOOL_CALLS, workdir)
    with ServerProcess("resources/workplace_assistant") as server:
        session = server.post("/seed_session", {}).json()["session_id"]
        ours = [server.post(f"/{name}", args, headers={"X-Session-Id": session}).json()["output"]
                for name, args in TOOL_CALLS]
    differ = [(TOOL_CALLS[i], ours[i], theirs[i]) for i in range(len(ours)) if ours[i] != theirs[i]]
    assert not differ, f"{len(differ)} of {len(ours)} results differ: {differ[:3]}"
    compared("workplace_assistant_tools", len(ours))
