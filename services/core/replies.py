"""The one way to build a `/verify` reply: the request echoed back plus a fresh verdict.

Every environment answers through `scored_reply` or `failed_reply` (and `exception_reply`,
the one place an exception becomes a masked failure); the server passes every reply through
`conform` to the environment's reply model. A request may carry the verdict of an
earlier verify (re-verifying a collected rollout): those fields are dropped before the new
verdict is added, so they can neither collide with it nor leak a stale `mask_sample`.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Mapping, TypeVar, cast

from pydantic import BaseModel, TypeAdapter, ValidationError

from .failures import FailureKind, failure_of
from .redaction import redact_text
from .schemas import VerifyReply, VerifyRequest

R = TypeVar("R", bound=VerifyReply)

# What a reply adds to the request; never echoed from a request.
VERDICT_FIELDS = frozenset({"reward", "reward_components", "mask_sample", "failure_kind", "failure_reason"})
MAX_REASON_CHARS = 2000


def _echo(request: VerifyRequest | Mapping[str, Any]) -> dict[str, Any]:
    """The request's fields (typed and extra), minus any earlier verdict."""
    if isinstance(request, BaseModel):
        fields = {**request.__dict__, **(request.model_extra or {})}
    else:
        fields = dict(request)
    for name in VERDICT_FIELDS:
        fields.pop(name, None)
    return fields


def _finite(value: Any, what: str) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} is {number}, not a finite number")
    return number


def scored_reply(request: VerifyRequest, reward: float | None = None, *,
                 components: Mapping[str, float] | None = None, model: type[R] = VerifyReply,  # type: ignore[assignment]
                 failure: tuple[FailureKind | str, str, bool] | None = None, **fields: Any) -> R:
    """A judged request: `reward` (or the sum of `components`) plus the environment's own reply fields.

    `failure` = (kind, reason, mask) marks a verdict that is still a score but had a problem
    (e.g. a timeout scored 0 by policy). A non-finite score is a verifier bug: a masked crash.
    """
    try:
        parts = {str(k): _finite(v, f"reward component {k!r}") for k, v in components.items()} if components else None
        value = float(sum(parts.values())) if parts else _finite(reward if reward is not None else 0.0, "reward")
    except (TypeError, ValueError) as exc:
        return failed_reply(request, FailureKind.CRASH, f"verifier produced an invalid reward: {exc}", model=model)
    verdict: dict[str, Any] = {"reward": value, "reward_components": parts, "mask_sample": False,
                               "failure_kind": None, "failure_reason": None}
    if failure is not None:
        kind, reason, mask = failure
        verdict.update(mask_sample=bool(mask), failure_kind=FailureKind(kind),
                       failure_reason=redact_text(reason)[:MAX_REASON_CHARS])
    echoed = _echo(request)
    if isinstance(request, BaseModel):
        # the request was validated already: no second validation pass on the hot path
        return cast(R, model.model_construct(**{**echoed, **fields, **verdict}))
    return _validated(model, {**echoed, **fields, **verdict})


@functools.lru_cache(maxsize=None)
def _field_adapter(model: type[BaseModel], name: str) -> TypeAdapter[Any]:
    """Built once per reply model and field: a batch of failing items must not rebuild validators."""
    return TypeAdapter(model.model_fields[name].annotation or Any)


def conform(reply: VerifyReply, model: type[R]) -> R:
    """`reply` as the environment's reply model, whichever builder made it, without the fields that
    model declares holding a value of another type. Such a value was echoed from the request (a bad
    row's `task_name: [..]`, an extra named like a verdict detail) and would break the reply's schema.
    The server applies it to every reply, so environments need not pass `model=` to the builders."""
    fields = {**reply.__dict__, **(reply.model_extra or {})}
    dropped = False
    for name in model.model_fields:
        if name in VerifyReply.model_fields or fields.get(name) is None:
            continue  # the shared fields are typed by the builders; None is every optional's default
        try:
            _field_adapter(model, name).validate_python(fields[name], strict=True)
        except ValidationError:
            del fields[name]
            dropped = True
    if type(reply) is model and not dropped:
        return cast(R, reply)
    return cast(R, model.model_construct(**fields))


def failed_reply(request: VerifyRequest | Mapping[str, Any], kind: FailureKind | str, reason: str, *,
                 mask: bool = True, model: type[R] = VerifyReply, **fields: Any) -> R:  # type: ignore[assignment]
    """A request that could not be judged: reward 0, masked, with the kind and reason (a kind outside
    the vocabulary is a ValueError: a bug in the caller)."""
    verdict = {"reward": 0.0, "reward_components": None, "mask_sample": mask, "failure_kind": FailureKind(kind),
               "failure_reason": redact_text(reason)[:MAX_REASON_CHARS]}
    echoed = _echo(request)
    if isinstance(request, BaseModel):
        return cast(R, model.model_construct(**{**echoed, **fields, **verdict}))
    return _validated(model, {**echoed, **fields, **verdict})


def exception_reply(request: VerifyRequest | Mapping[str, Any], exc: BaseException, context: str = "", *,
                    model: type[R] = VerifyReply, **fields: Any) -> R:  # type: ignore[assignment]
    """The masked reply for a verify that raised `exc` (kind from `failure_of`)."""
    kind, reason = failure_of(exc)
    return failed_reply(request, kind, f"{context}: {reason}" if context else reason, model=model, **fields)


def _validated(model: type[R], data: dict[str, Any]) -> R:
    """A reply from an unvalidated dict (a batch item that failed parsing): echo what validates, never raise."""
    data.setdefault("response", {"output": []})
    try:
        return model.model_validate(data)
    except ValidationError:
        # the item is malformed (often why it failed): drop the parts that do not validate
        data["response"] = {"output": []}
        data.pop("responses_create_params", None)
        try:
            return model.model_validate(data)
        except ValidationError:
            verdict = {k: data[k] for k in VERDICT_FIELDS if k in data}
            return model.model_validate({"response": {"output": []}, **verdict})
