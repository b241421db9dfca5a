"""The project management tools (NeMo-Gym's `project_management_*`)."""
from __future__ import annotations

import re
from typing import Any

import pandas as pd

from .tables import next_id

TASK_LISTS = ["Backlog", "In Progress", "In Review", "Completed"]
BOARDS = ["Back end", "Front end", "Design"]
_EMAIL = re.compile(r"^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$")


class ProjectTools:
    tasks: pd.DataFrame

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
        task_id = next_id(self.tasks["task_id"])
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
