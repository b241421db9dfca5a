"""NeMo-Gym's workplace assistant toolset: 27 prefixed tools over five pandas tables.

The behaviour (messages, validation, pagination, id allocation, row index labels) follows
NeMo-Gym 0.7.0 on purpose: its rows were generated against it and its verifier compares whole
tables, index included, so an agent must see the same tool results and leave the same tables.
A tool never raises for bad arguments: it returns a message the model can act on, like NeMo-Gym.
"""
from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

SEED = Path(__file__).resolve().parent / "seed"
NOW = pd.to_datetime("2023-11-30T23:59:00")  # "now" of every row's system prompt
TASK_LISTS = ["Backlog", "In Progress", "In Review", "Completed"]
BOARDS = ["Back end", "Front end", "Design"]
CUSTOMER_STATUSES = ["Qualified", "Won", "Lost", "Lead", "Proposal"]
PRODUCTS = ["Software", "Hardware", "Services", "Consulting", "Training"]
PLOT_VALUES = ["total_visits", "session_duration_seconds", "user_engaged", "visits_direct", "visits_referral",
               "visits_search_engine", "visits_social_media"]
PLOT_TYPES = ["bar", "line", "scatter", "histogram"]
EVENT_FIELDS = ["event_id", "event_name", "participant_email", "event_start", "duration"]
# Compared case-sensitively by verification; every other column case-insensitively
CASE_SENSITIVE = ("status", "list_name", "board")
_EMAIL = re.compile(r"^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$")


@cache
def _seed_table(name: str) -> pd.DataFrame:
    """A seed table, read once per process (every session and replay starts from a copy)."""
    if name == "email_addresses":  # the directory: one address a line, no header
        return pd.read_csv(SEED / f"{name}.csv", header=None, names=["email_address"])
    return pd.read_csv(SEED / f"{name}.csv", dtype=str)


@cache
def schemas() -> list[dict[str, Any]]:
    """The Responses API function schemas of the 27 tools, as NeMo-Gym's rows carry them."""
    return json.loads((Path(__file__).resolve().parent / "tools.json").read_text())


def _paged(records: list[dict[str, Any]], key: str, page: int, page_size: int) -> dict[str, Any]:
    total = len(records)
    pages = (total + page_size - 1) // page_size
    page = max(1, min(page, pages)) if pages > 0 else 1
    start = (page - 1) * page_size
    return {key: records[start:min(start + page_size, total)],
            "pagination": {f"total_{key}": total, "page": page, "page_size": page_size, "total_pages": pages}}


def _next_id(ids: pd.Series) -> str:
    return str(int(ids.max()) + 1).zfill(8)


def _is_event_id(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 8 and value.isdigit()


def _bad_timestamp(value: Any) -> bool:
    try:
        pd.Timestamp(value)
    except ValueError:
        return True
    return False


def _bad_duration(value: Any) -> str | None:
    try:
        return "Duration must be a positive number of minutes." if int(value) <= 0 else None
    except ValueError:
        return "Invalid duration format. Expected a number of minutes."


class Workspace:
    """One session's company: its tables and the tools that read and change them."""

    def __init__(self) -> None:
        self.directory = _seed_table("email_addresses")  # never changed: shared
        self.emails = _seed_table("emails").copy()
        self.events = _seed_table("calendar_events").copy()
        self.tasks = _seed_table("project_tasks").copy()
        self.customers = _seed_table("customer_relationship_manager_data").copy()
        self.visits = _seed_table("analytics_data").copy()
        self.visits["user_engaged"] = self.visits["user_engaged"] == "True"
        self.plots = pd.DataFrame(columns=["file_path"])

    def state(self) -> list[pd.DataFrame]:
        """The tables verification compares (the directory and visits never change)."""
        return [self.events, self.emails, self.plots, self.tasks, self.customers]

    # ---- directory ---------------------------------------------------------- #
    def company_directory_find_email_address(self, name: str = "") -> Any:
        if name == "":
            return "Name not provided."
        found = self.directory[self.directory["email_address"].str.contains(name.lower(), case=False)]
        return found["email_address"].values.tolist()

    # ---- email -------------------------------------------------------------- #
    def email_get_email_information_by_id(self, email_id: Any = None, field: Any = None) -> Any:
        if not email_id:
            return "Email ID not provided."
        if not field:
            return "Field not provided."
        try:
            found = self.emails[self.emails["email_id"] == email_id].to_dict(orient="records")
            if not found:
                return "Email not found."
            if field in found[0]:
                return {field: found[0][field]}
            return f"Field '{field}' not found. Available fields: {', '.join(found[0].keys())}"
        except Exception as exc:
            return f"Error retrieving email information: {exc}"

    def email_search_emails(self, query: Any = "", date_min: Any = None, date_max: Any = None, page: Any = 1,
                            page_size: Any = 5) -> Any:
        try:
            words = query.lower().split()

            def matches(row: pd.Series) -> bool:
                text = f"{row['subject']} {row['body']} {row['sender/recipient']}".lower()
                return all(word in text for word in words)

            hits = self.emails[self.emails.apply(matches, axis=1)].copy()
            hits["_sent"] = pd.to_datetime(hits["sent_datetime"])
            records = hits.sort_values("_sent", ascending=False).drop(columns=["_sent"]).to_dict(orient="records")
            if date_min:
                records = [e for e in records
                           if pd.Timestamp(e["sent_datetime"]).date() >= pd.Timestamp(date_min).date()]
            if date_max:  # inclusive: whole days
                records = [e for e in records
                           if pd.Timestamp(e["sent_datetime"]).date() <= pd.Timestamp(date_max).date()]
            return _paged(records, "emails", page, page_size) if records else "No emails found."
        except Exception as exc:
            return f"Error searching emails: {exc}"

    def email_send_email(self, recipient: Any = None, subject: Any = None, body: Any = None) -> Any:
        if not recipient or not subject or not body:
            return "Recipient, subject, or body not provided."
        if "@" not in recipient or "." not in recipient:
            return "Invalid recipient email address."
        try:
            email_id = str(int(self.emails["email_id"].max()) + 1) if not self.emails.empty else "1"
            sent = {"email_id": email_id, "inbox/outbox": "outbox", "sender/recipient": recipient.lower(),
                    "subject": subject, "sent_datetime": str(NOW), "body": body}
            self.emails = pd.concat([self.emails, pd.DataFrame([sent])], ignore_index=True)
            return "Email sent successfully."
        except Exception as exc:
            return f"Error sending email: {exc}"

    def email_delete_email(self, email_id: Any = None) -> Any:
        if not email_id:
            return "Email ID not provided."
        try:
            if email_id not in self.emails["email_id"].values:
                return "Email not found."
            self.emails = self.emails[self.emails["email_id"] != email_id]
            return "Email deleted successfully."
        except Exception as exc:
            return f"Error deleting email: {exc}"

    def _resend(self, email_id: Any, recipient: Any, subject_prefix: str, body: Any, done: str) -> Any:
        if email_id not in self.emails["email_id"].values:
            return "Email not found."
        email = self.emails[self.emails["email_id"] == email_id].to_dict(orient="records")[0]
        result = self.email_send_email(recipient if recipient is not None else email["sender/recipient"],
                                       f"{subject_prefix}: {email['subject']}",
                                       body if body is not None else email["body"])
        return result if "Error" in result or "Invalid" in result else done

    def email_forward_email(self, email_id: Any = None, recipient: Any = None) -> Any:
        if not email_id or not recipient:
            return "Email ID or recipient not provided."
        if "@" not in recipient or "." not in recipient:
            return "Invalid recipient email address."
        try:
            return self._resend(email_id, recipient.lower(), "FW", None, "Email forwarded successfully.")
        except Exception as exc:
            return f"Error forwarding email: {exc}"

    def email_reply_email(self, email_id: Any = None, body: Any = None) -> Any:
        if not email_id or not body:
            return "Email ID or body not provided."
        try:
            return self._resend(email_id, None, "RE", body, "Email replied successfully.")
        except Exception as exc:
            return f"Error replying to email: {exc}"

    # ---- calendar ----------------------------------------------------------- #
    def calendar_get_event_information_by_id(self, event_id: Any = None, field: Any = None) -> Any:
        if not event_id:
            return "Event ID not provided."
        if not field:
            return "Field not provided."
        if not _is_event_id(event_id):
            return "Invalid event ID format. Expected 8-digit ID."
        if field not in EVENT_FIELDS:
            return f"Invalid field. Available fields are: {', '.join(EVENT_FIELDS)}"
        found = self.events[self.events["event_id"] == event_id].to_dict(orient="records")
        if not found:
            return "Event not found."
        return {field: found[0][field]} if field in found[0] else "Field not found."

    def calendar_search_events(self, query: Any = "", time_min: Any = None, time_max: Any = None, page: Any = 1,
                               page_size: Any = 5) -> Any:
        if time_min:
            try:
                time_min = pd.Timestamp(time_min)
            except ValueError:
                return "Invalid time_min format. Expected YYYY-MM-DD HH:MM:SS."
        if time_max:
            try:
                time_max = pd.Timestamp(time_max)
            except ValueError:
                return "Invalid time_max format. Expected YYYY-MM-DD HH:MM:SS."
        events = self.events
        hit = (events["event_name"].str.contains(query, case=False, na=False)
               | events["participant_email"].str.contains(query, case=False, na=False))
        records = events[hit].to_dict(orient="records")
        if time_min:
            records = [e for e in records if pd.Timestamp(e["event_start"]) >= time_min]
        if time_max:
            records = [e for e in records if pd.Timestamp(e["event_start"]) <= time_max]
        if not records:
            return "No events found."
        records.sort(key=lambda e: pd.Timestamp(e["event_start"]), reverse=True)
        return _paged(records, "events", page, page_size)

    def calendar_create_event(self, event_name: Any = None, participant_email: Any = None, event_start: Any = None,
                              duration: Any = None) -> Any:
        for value, label in ((event_name, "Event name"), (participant_email, "Participant email"),
                             (event_start, "Event start"), (duration, "Event duration")):
            if not value:
                return f"{label} not provided."
        if _bad_timestamp(event_start):
            return "Invalid event_start format. Expected YYYY-MM-DD HH:MM:SS."
        if problem := _bad_duration(duration):
            return problem
        event_id = _next_id(self.events["event_id"])
        new = pd.DataFrame({"event_id": [event_id], "event_name": [event_name],
                            "participant_email": [participant_email.lower()], "event_start": [event_start],
                            "duration": [duration]})
        self.events = pd.concat([self.events, new])  # keeps index labels: the new row is labelled 0
        return event_id

    def calendar_delete_event(self, event_id: Any = None) -> Any:
        if not event_id:
            return "Event ID not provided."
        if not _is_event_id(event_id):
            return "Invalid event ID format. Expected 8-digit ID."
        if event_id not in self.events["event_id"].values:
            return "Event not found."
        self.events = self.events[self.events["event_id"] != event_id]
        return "Event deleted successfully."

    def calendar_update_event(self, event_id: Any = None, field: Any = None, new_value: Any = None) -> Any:
        if not event_id or not field or not new_value:
            return "Event ID, field, or new value not provided."
        if not _is_event_id(event_id):
            return "Invalid event ID format. Expected 8-digit ID."
        if field not in EVENT_FIELDS[1:]:
            return f"Invalid field. Available fields are: {', '.join(EVENT_FIELDS[1:])}"
        if field == "event_start" and _bad_timestamp(new_value):
            return "Invalid event_start format. Expected YYYY-MM-DD HH:MM:SS."
        if field == "duration" and (problem := _bad_duration(new_value)):
            return problem
        if event_id not in self.events["event_id"].values:
            return "Event not found."
        if field == "participant_email":
            new_value = new_value.lower()
        self.events.loc[self.events["event_id"] == event_id, field] = new_value
        return "Event updated successfully."

    # ---- analytics ---------------------------------------------------------- #
    def _visits_between(self, time_min: Any, time_max: Any) -> pd.DataFrame:
        data = self.visits[self.visits["date_of_visit"] >= time_min] if time_min else self.visits[:]
        return data[data["date_of_visit"] <= time_max] if time_max else data

    def analytics_get_visitor_information_by_id(self, visitor_id: Any = None) -> Any:
        if not visitor_id:
            return "Visitor ID not provided."
        found = self.visits[self.visits["visitor_id"] == visitor_id].to_dict(orient="records")
        return found or "Visitor not found."

    def analytics_create_plot(self, time_min: Any = None, time_max: Any = None, value_to_plot: Any = None,
                              plot_type: Any = None) -> Any:
        if not time_min:
            return "Start date not provided."
        if not time_max:
            return "End date not provided."
        if value_to_plot not in PLOT_VALUES:
            return f"Value to plot must be one of {', '.join(repr(v) for v in PLOT_VALUES)}"
        if plot_type not in PLOT_TYPES:
            return "Plot type must be one of 'bar', 'line', 'scatter', or 'histogram'"
        path = f"plots/{time_min}_{time_max}_{value_to_plot}_{plot_type}.png"  # recorded, not drawn
        self.plots.loc[len(self.plots)] = [path]
        return path

    def analytics_total_visits_count(self, time_min: Any = None, time_max: Any = None) -> Any:
        return self._visits_between(time_min, time_max).groupby("date_of_visit").size().to_dict()

    def analytics_engaged_users_count(self, time_min: Any = None, time_max: Any = None) -> Any:
        data = self._visits_between(time_min, time_max).copy()
        data["user_engaged"] = data["user_engaged"].astype(bool).astype(int)
        return data.groupby("date_of_visit")["user_engaged"].sum().to_dict()

    def analytics_traffic_source_count(self, time_min: Any = None, time_max: Any = None,
                                       traffic_source: Any = None) -> Any:
        data = self._visits_between(time_min, time_max).copy()
        if not traffic_source:
            return data.groupby("date_of_visit").size().to_dict()
        data["from_source"] = (data["traffic_source"] == traffic_source).astype(int)
        return data.groupby("date_of_visit")["from_source"].sum().to_dict()

    def analytics_get_average_session_duration(self, time_min: Any = None, time_max: Any = None) -> Any:
        data = self._visits_between(time_min, time_max).copy()
        data["session_duration_seconds"] = data["session_duration_seconds"].astype(float)
        return data.groupby("date_of_visit")["session_duration_seconds"].mean().to_dict()

    # ---- project management ------------------------------------------------- #
    def project_management_get_task_information_by_id(self, task_id: Any = None, field: Any = None) -> Any:
        if not task_id:
            return "Task ID not provided."
        if not field:
            return "Field not provided."
        found = self.tasks[self.tasks["task_id"] == task_id].to_dict(orient="records")
        if not found:
            return "Task not found."
        return {field: found[0][field]} if field in found[0] else "Field not found."

    def project_management_search_tasks(self, task_name: Any = None, assigned_to_email: Any = None,
                                        list_name: Any = None, due_date: Any = None, board: Any = None) -> Any:
        if not any([task_name, assigned_to_email, list_name, due_date, board]):
            return "No search parameters provided."
        if assigned_to_email and not _EMAIL.match(assigned_to_email):
            return "Invalid email format for assigned_to_email."
        tasks = self.tasks.copy()
        if assigned_to_email:
            tasks = tasks[tasks["assigned_to_email"].str.lower() == assigned_to_email.lower()]
        for column, value in (("task_name", task_name), ("list_name", list_name), ("due_date", due_date),
                              ("board", board)):
            if value:
                tasks = tasks[tasks[column].str.contains(value, case=False)]
        return tasks.to_dict(orient="records")

    def _check_task_value(self, field: str, value: Any) -> str | None:
        if field == "board" and value not in BOARDS:
            return "Board not valid. Please choose from: 'Back end', 'Front end', 'Design'."
        if field == "list_name" and value not in TASK_LISTS:
            return "List not valid. Please choose from: 'Backlog', 'In Progress', 'In Review', 'Completed'."
        if field == "assigned_to_email" and value not in self.tasks["assigned_to_email"].str.lower().values:
            return "Assignee email not valid. Please choose from the list of team members."
        return None

    def project_management_create_task(self, task_name: Any = None, assigned_to_email: Any = None,
                                       list_name: Any = None, due_date: Any = None, board: Any = None) -> Any:
        if not all([task_name, assigned_to_email, list_name, due_date, board]):
            return "Missing task details."
        assigned_to_email = assigned_to_email.lower()
        for field, value in (("assigned_to_email", assigned_to_email), ("list_name", list_name), ("board", board)):
            if problem := self._check_task_value(field, value):
                return problem
        task_id = _next_id(self.tasks["task_id"])
        new = pd.DataFrame({"task_id": [task_id], "task_name": [task_name], "assigned_to_email": [assigned_to_email],
                            "list_name": [list_name], "due_date": [due_date], "board": [board]})
        self.tasks = pd.concat([self.tasks, new], ignore_index=True)
        return task_id

    def project_management_delete_task(self, task_id: Any = None) -> Any:
        if not task_id:
            return "Task ID not provided."
        if task_id not in self.tasks["task_id"].values:
            return "Task not found."
        self.tasks = self.tasks[self.tasks["task_id"] != task_id]
        return "Task deleted successfully."

    def project_management_update_task(self, task_id: Any = None, field: Any = None, new_value: Any = None) -> Any:
        if not task_id or not field or not new_value:
            return "Task ID, field, or new value not provided."
        if field == "assigned_to_email":
            new_value = new_value.lower()
        if problem := self._check_task_value(field, new_value):
            return problem
        if task_id not in self.tasks["task_id"].values:
            return "Task not found."
        if field not in self.tasks.columns:
            return "Field not valid."
        self.tasks.loc[self.tasks["task_id"] == task_id, field] = new_value
        return "Task updated successfully."

    # ---- customer relationship manager -------------------------------------- #
    def customer_relationship_manager_search_customers(
            self, customer_name: Any = None, customer_email: Any = None, product_interest: Any = None,
            status: Any = None, assigned_to_email: Any = None, last_contact_date_min: Any = None,
            last_contact_date_max: Any = None, follow_up_by_min: Any = None, follow_up_by_max: Any = None,
            page: Any = 1, page_size: Any = 5) -> Any:
        contains = {"customer_name": customer_name, "customer_email": customer_email,
                    "product_interest": product_interest, "status": status, "assigned_to_email": assigned_to_email}
        bounds = [("last_contact_date", ">=", last_contact_date_min), ("last_contact_date", "<=", last_contact_date_max),
                  ("follow_up_by", ">=", follow_up_by_min), ("follow_up_by", "<=", follow_up_by_max)]
        if not any([*contains.values(), *(value for _, _, value in bounds)]):
            return "No search parameters provided. Please provide at least one parameter."
        customers = self.customers.copy()
        for column, value in contains.items():
            if value:
                customers = customers[customers[column].str.contains(value, case=False)]
        for column, op, value in bounds:
            if value:
                keep = customers[column] >= value if op == ">=" else customers[column] <= value
                customers = customers[keep]
        records = customers.to_dict(orient="records")
        return _paged(records, "customers", page, page_size) if records else "No customers found."

    def customer_relationship_manager_update_customer(self, customer_id: Any = None, field: Any = None,
                                                      new_value: Any = None) -> Any:
        if not customer_id or not field or not new_value:
            return "Customer ID, field, or new value not provided."
        if field == "status" and new_value not in CUSTOMER_STATUSES:
            return "Status not valid. Please choose from: 'Qualified', 'Won', 'Lost', 'Lead', 'Proposal'"
        if field == "product_interest" and new_value not in PRODUCTS:
            return ("Product interest not valid. Please choose from: 'Software', 'Hardware', 'Services', "
                    "'Consulting', 'Training'")
        if field in ("customer_email", "assigned_to_email"):
            new_value = new_value.lower()
        if customer_id not in self.customers["customer_id"].values:
            return "Customer not found."
        if field not in self.customers.columns:
            return ("Field not valid. Please choose from: 'customer_name', 'assigned_to_email', 'customer_email', "
                    "'customer_phone', 'last_contact_date', 'product_interest', 'status', 'notes', 'follow_up_by'")
        self.customers.loc[self.customers["customer_id"] == customer_id, field] = new_value
        return "Customer updated successfully."

    def customer_relationship_manager_add_customer(
            self, customer_name: Any = None, assigned_to_email: Any = None, status: Any = None,
            customer_email: Any = None, customer_phone: Any = None, last_contact_date: Any = None,
            product_interest: Any = None, notes: Any = "", follow_up_by: Any = None) -> Any:
        if not all([customer_name, assigned_to_email, status]):
            return "Please provide all required fields: customer_name, assigned_to_email, status."
        new_id = _next_id(self.customers["customer_id"])
        new = pd.DataFrame({
            "customer_id": [new_id], "customer_name": [customer_name],
            "customer_email": [customer_email.lower() if customer_email else customer_email],
            "customer_phone": [customer_phone], "last_contact_date": [last_contact_date],
            "product_interest": [product_interest], "status": [status],
            "assigned_to_email": [assigned_to_email.lower()], "notes": [notes], "follow_up_by": [follow_up_by]})
        self.customers = pd.concat([self.customers, new], ignore_index=True)
        return new_id

    def customer_relationship_manager_delete_customer(self, customer_id: Any = None) -> Any:
        if not customer_id:
            return "Customer ID not provided."
        if customer_id not in self.customers["customer_id"].values:
            return "Customer not found."
        self.customers = self.customers[self.customers["customer_id"] != customer_id]
        return "Customer deleted successfully."


TOOL_NAMES: tuple[str, ...] = tuple(s["name"] for s in schemas())
