"""The customer relationship manager tools (NeMo-Gym's `customer_relationship_manager_*`)."""
from __future__ import annotations

from typing import Any

import pandas as pd

from .tables import next_id, paged

CUSTOMER_STATUSES = ["Qualified", "Won", "Lost", "Lead", "Proposal"]
PRODUCTS = ["Software", "Hardware", "Services", "Consulting", "Training"]


class CrmTools:
    customers: pd.DataFrame

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
        return paged(records, "customers", page, page_size) if records else "No customers found."

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
        new_id = next_id(self.customers["customer_id"])
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
