"""The company directory and email tools (NeMo-Gym's `company_directory_*` and `email_*`)."""
from __future__ import annotations

from typing import Any

import pandas as pd

from .tables import NOW, paged


class EmailTools:
    directory: pd.DataFrame
    emails: pd.DataFrame

    def company_directory_find_email_address(self, name: str = "") -> Any:
        if name == "":
            return "Name not provided."
        found = self.directory[self.directory["email_address"].str.contains(name.lower(), case=False)]
        return found["email_address"].values.tolist()

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
            return paged(records, "emails", page, page_size) if records else "No emails found."
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
