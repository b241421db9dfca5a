"""Errors that become clear JSON 4xx/5xx replies instead of tracebacks."""
from __future__ import annotations

from typing import Any

from .failures import FailureKind
from .redaction import redact, redact_text


class GymError(Exception):
    """An error with an HTTP status and a message meant for the caller."""

    status_code = 500
    error_type = "internal_error"

    def __init__(self, message: str, *, status_code: int | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        if status_code is not None:
            self.status_code = status_code
        self.details = details


class BadRequest(GymError):
    status_code = 400
    error_type = "bad_request"


class NotFound(GymError):
    status_code = 404
    error_type = "not_found"


class Conflict(GymError):
    status_code = 409
    error_type = "conflict"


class PayloadTooLarge(GymError):
    status_code = 413
    error_type = "payload_too_large"


class TooManyRequests(GymError):
    status_code = 429
    error_type = "too_many_requests"


class Unavailable(GymError):
    status_code = 503
    error_type = "unavailable"


class UpstreamError(GymError):
    """A call to another server failed; `kind` says why (a FailureKind)."""

    status_code = 502
    error_type = "upstream_error"

    def __init__(self, message: str, *, kind: FailureKind | str = FailureKind.UPSTREAM, status_code: int | None = None,
                 upstream_status: int | None = None, body: str | None = None) -> None:
        super().__init__(message, status_code=status_code or (504 if kind == FailureKind.TIMEOUT else 502))
        self.kind = FailureKind(kind)
        self.upstream_status = upstream_status
        self.body = body


def error_body(message: str, error_type: str, request_id: str | None = None, **details: Any) -> dict[str, Any]:
    """One shape for every error reply: `detail` (FastAPI-compatible) and a structured `error`; secrets
    echoed in a message (a URL with a password, a bearer token) are masked here, for every server."""
    message = redact_text(message)
    error: dict[str, Any] = {"type": error_type, "message": message}
    if request_id:
        error["request_id"] = request_id
    error.update(redact(details))
    return {"detail": message, "error": error}


def gym_error_body(exc: GymError, request_id: str | None = None) -> dict[str, Any]:
    """The reply body of a `GymError`, wherever it is answered (a FastAPI route or a mounted app)."""
    return error_body(exc.message, exc.error_type, request_id, **exc.details)


def counted_failure(exc: GymError) -> str | None:
    """The failure kind a `GymError` reply counts as in the metrics: a 5xx only (4xx are the caller's)."""
    return str(getattr(exc, "kind", None) or "upstream") if exc.status_code >= 500 else None
