"""One plain ASGI middleware per concern, composed (outermost first) by `services.core.app.create_app`.

Plain ASGI rather than Starlette's BaseHTTPMiddleware keeps the per-request cost small and
lets streaming replies pass through untouched.
"""
from __future__ import annotations

from .admission import AdmissionControl, AdmissionQueue, admission_queue
from .auth import AuthMiddleware
from .body_limit import BodyLimitMiddleware
from .disconnect import DisconnectMiddleware
from .errors import ErrorReplyMiddleware
from .input_guard import InputGuardMiddleware
from .metrics import MetricsMiddleware
from .mounts import MountsMiddleware
from .reply import ReplyMiddleware
from .request_id import REQUEST_ID_HEADER, RequestIdMiddleware, request_id_of

__all__ = [
    "AdmissionControl",
    "AdmissionQueue",
    "AuthMiddleware",
    "BodyLimitMiddleware",
    "DisconnectMiddleware",
    "ErrorReplyMiddleware",
    "InputGuardMiddleware",
    "MetricsMiddleware",
    "MountsMiddleware",
    "REQUEST_ID_HEADER",
    "ReplyMiddleware",
    "RequestIdMiddleware",
    "admission_queue",
    "request_id_of",
]
