"""The web-analytics tools (NeMo-Gym's `analytics_*`): counts per day over the visits, and plots
that are recorded (their file names), not drawn."""
from __future__ import annotations

from typing import Any

import pandas as pd

PLOT_VALUES = ["total_visits", "session_duration_seconds", "user_engaged", "visits_direct", "visits_referral",
               "visits_search_engine", "visits_social_media"]
PLOT_TYPES = ["bar", "line", "scatter", "histogram"]


class AnalyticsTools:
    visits: pd.DataFrame
    plots: pd.DataFrame

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
