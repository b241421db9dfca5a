"""Schemathesis against a running server: bodies generated from its own `/openapi.json`.

Every operation is fuzzed with positive and negative data and checked for: no 5xx, no status
code the schema does not document, no reply that violates its documented schema, and a
content type that matches. Derandomized so CI runs are reproducible.
"""
from __future__ import annotations

from typing import Any, Callable

import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                 status_code_conformance)

CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, content_type_conformance]


def fuzz(url: str, *, max_examples: int = 15, headers: dict[str, str] | None = None,
         skip: Callable[[str, str], bool] = lambda method, path: False) -> list[str]:
    """Fuzz every operation of the server at `url`; returns failures as readable strings."""
    headers = headers or {}
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=headers)
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if skip(operation.method.upper(), operation.path):
            continue
        operations += 1

        for mode in GenerationMode:
            try:
                strategy = operation.as_strategy(generation_mode=mode)
            except Exception as exc:  # noqa: BLE001 - e.g. nothing to negate in an operation without inputs
                if mode is GenerationMode.POSITIVE:
                    failures.append(f"{operation.method.upper()} {operation.path}: no strategy: {exc}")
                continue

            @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck), print_blob=False)
            @given(case=strategy)
            def run(case: Any) -> None:
                case.call_and_validate(base_url=url, headers=headers, checks=CHECKS, timeout=60)

            try:
                run()
            except Unsatisfiable:
                if mode is GenerationMode.POSITIVE:
                    failures.append(f"{operation.method.upper()} {operation.path}: no valid request can be generated")
            except BaseException as exc:  # noqa: BLE001 - report every operation's failure (groups too)
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                failures.append(f"{operation.method.upper()} {operation.path} ({mode.value}): {exc}"[:3000])
    assert operations, f"no operations in {url}/openapi.json"
    return failures
