"""NeMo-Gym's resources servers as gymserve servers (`kind: nemo_gym/<server>`).

NeMo-Gym's own server code runs unchanged in a Python 3.13 virtualenv of its own (`venv`); a
gymserve sidecar in our virtualenv fronts it (`sidecar`), so every request reaches it through
our key, body limits, deadlines, retries and failure contract; `wheel` reads the catalogue the
wheel ships and `catalogue` says which of its servers run here and why not.
"""
from __future__ import annotations

KIND_PREFIX = "nemo_gym/"


def is_nemo_kind(kind: str) -> bool:
    return kind.startswith(KIND_PREFIX)
