"""The failure vocabulary: why a verify or rollout could not be judged.

A failed sample is never a fabricated reward 0: it is masked and carries one of these
kinds, so a trainer can drop it and an operator can count failures by cause.
"""
from __future__ import annotations

from enum import Enum


class FailureKind(str, Enum):
    """`failure_kind` values (the JSON is the plain string)."""

    TIMEOUT = "timeout"          # a deadline ran out (worker item, upstream call, rollout)
    CRASH = "crash"              # the verifier or agent itself failed (worker died, code raised)
    BAD_REQUEST = "bad_request"  # the row or the model output cannot be judged as sent
    UPSTREAM = "upstream"        # another server failed or answered something unusable
    SANDBOX = "sandbox"          # the code sandbox broke (not the program under test)
    CONTEXT_OVERFLOW = "context_overflow"  # the row's prompt does not fit the model server's context
    SESSION_LOST = "session_lost"          # the replica holding the session died and it cannot be rebuilt
    SESSION_DIVERGED = "session_diverged"  # rebuilding the session elsewhere gave other replies than it had

    def __str__(self) -> str:  # metrics labels and f-strings show the wire value on every Python
        return self.value


FAILURE_KINDS: tuple[str, ...] = tuple(kind.value for kind in FailureKind)


def as_kind(value: object, default: FailureKind = FailureKind.CRASH) -> FailureKind:
    """`value` as a FailureKind; anything not in the vocabulary becomes `default`."""
    try:
        return FailureKind(value)
    except ValueError:
        return default


def failure_of(exc: BaseException) -> tuple[FailureKind, str]:
    """The one mapping from an exception to (failure kind, reason) used by every server."""
    # imported here: errors/pool must not depend on the reply machinery
    from .errors import BadRequest, GymError
    from .pool import TaskError, WorkerFailure

    if isinstance(exc, WorkerFailure):
        return as_kind(exc.kind), str(exc) or "worker failed"
    if isinstance(exc, TaskError):
        return FailureKind.CRASH, f"verifier raised {exc}"
    if isinstance(exc, BadRequest):
        return FailureKind.BAD_REQUEST, exc.message
    if isinstance(exc, GymError):
        kind = getattr(exc, "kind", None) or exc.details.get("kind")
        return as_kind(kind, FailureKind.UPSTREAM), exc.message
    return FailureKind.CRASH, f"unexpected error: {type(exc).__name__}: {exc}"
