"""`gymserve check KIND`: a conformance checker for gymserve servers (in the spirit of Gymnasium's
`check_env`). It starts the server and the helpers it needs as real local processes with an API
key set, runs named checks against them, and reports each as passed or failed."""
from __future__ import annotations

from .kinds import run_check
from .report import Outcome, Report

__all__ = ["Outcome", "Report", "run_check"]
