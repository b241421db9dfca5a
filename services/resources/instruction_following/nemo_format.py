"""NeMo-Gym's instruction_following row format, read as NeMo-Gym 0.7.0 reads it.

Its rows keep `instruction_id_list`, `kwargs` and `grading_mode` under `verifier_metadata`; older
ones keep them at the top level. A field in `verifier_metadata` wins over the top-level one, as in
NeMo-Gym. `grading_mode` (`binary` or `fraction`) picks the row's reward. NeMo-Gym judges the text
of the response's last output item (its first content part), not every assistant message.
"""
from __future__ import annotations

from typing import Any

from services.core.errors import BadRequest
from services.core.schemas import ResponseObject, VerifyRequest

GRADING_MODES = {"binary": "all", "fraction": "fraction"}


def row_fields(request: VerifyRequest) -> dict[str, Any]:
    """instruction_id_list, kwargs, reward_mode (None: the server's) and nemo (a verifier_metadata row)."""
    top = request.model_extra or {}
    meta = getattr(request, "verifier_metadata", None)
    if meta is not None and not isinstance(meta, dict):
        raise BadRequest("verifier_metadata: expected an object")
    merged = {**{k: getattr(request, k, top.get(k)) for k in ("instruction_id_list", "kwargs")}, **top}
    merged.update(meta or {})
    grading = merged.get("grading_mode")
    where = "verifier_metadata.grading_mode" if meta and "grading_mode" in meta else "grading_mode"
    if grading is not None and (not isinstance(grading, str) or grading not in GRADING_MODES):
        raise BadRequest(f"{where}: expected 'binary' or 'fraction', got {grading!r}")
    return {"instruction_id_list": merged.get("instruction_id_list"), "kwargs": merged.get("kwargs"),
            "reward_mode": GRADING_MODES[grading] if grading is not None else None,
            "nemo": meta is not None}


def final_text(response: ResponseObject) -> str:
    """The first content part's text of the last output item ('' when it has none)."""
    if not response.output:
        return ""
    content = getattr(response.output[-1], "content", None)
    if isinstance(content, str):
        return content
    if content and isinstance(content[0], dict) and isinstance(content[0].get("text"), str):
        return str(content[0]["text"])
    return ""
