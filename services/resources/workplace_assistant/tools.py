"""NeMo-Gym's workplace assistant toolset: 27 prefixed tools over five pandas tables.

The behaviour (messages, validation, pagination, id allocation, row index labels) follows
NeMo-Gym 0.7.0 on purpose: its rows were generated against it and its verifier compares whole
tables, index included, so an agent must see the same tool results and leave the same tables.
A tool never raises for bad arguments: it returns a message the model can act on, like NeMo-Gym.
Each toolkit is a module of its own; `Workspace` puts them together over one session's tables.
"""
from __future__ import annotations

import pandas as pd

from .analytics_tools import AnalyticsTools
from .calendar_tools import CalendarTools
from .crm_tools import CrmTools
from .email_tools import EmailTools
from .project_tools import ProjectTools
from .tables import CASE_SENSITIVE, schemas, seed_table

__all__ = ["CASE_SENSITIVE", "TOOL_NAMES", "Workspace", "schemas"]


class Workspace(EmailTools, CalendarTools, AnalyticsTools, ProjectTools, CrmTools):
    """One session's company: its tables and the tools that read and change them."""

    def __init__(self) -> None:
        self.directory = seed_table("email_addresses")  # never changed: shared
        self.emails = seed_table("emails").copy()
        self.events = seed_table("calendar_events").copy()
        self.tasks = seed_table("project_tasks").copy()
        self.customers = seed_table("customer_relationship_manager_data").copy()
        self.visits = seed_table("analytics_data").copy()
        self.visits["user_engaged"] = self.visits["user_engaged"] == "True"
        self.plots = pd.DataFrame(columns=["file_path"])

    def state(self) -> list[pd.DataFrame]:
        """The tables verification compares (the directory and visits never change)."""
        return [self.events, self.emails, self.plots, self.tasks, self.customers]


TOOL_NAMES: tuple[str, ...] = tuple(s["name"] for s in schemas())
