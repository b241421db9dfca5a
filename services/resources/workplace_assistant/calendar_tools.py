"""The calendar tools (NeMo-Gym's `calendar_*`)."""
from __future__ import annotations

from typing import Any

import pandas as pd

from .tables import next_id, paged

EVENT_FIELDS = ["event_id", "event_name", "participant_email", "event_start", "duration"]


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


class CalendarTools:
    events: pd.DataFrame

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
        return paged(records, "events", page, page_size)

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
        event_id = next_id(self.events["event_id"])
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
