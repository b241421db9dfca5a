"""mcqa: multiple choice; reward 1 when the extracted option letter equals `expected_answer`.

Row fields: `options` (or `metadata.options`, or `choices`) and `expected_answer` (or
`metadata.expected_answer`). NeMo-Gym mcqa rows also work: their `grading_mode` and
`template_metadata.output_regex` are honoured. Extraction with the configured patterns
is cheap and runs inline; a row-supplied regex (untrusted, could backtrack forever) or a
very long response runs in the worker pool under its deadline.
"""
from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from pydantic import Field, field_validator

from services.core.errors import BadRequest
from services.core.pool import TaskError, WorkerFailure
from services.core.replies import exception_reply, scored_reply
from services.core.resource import Environment, ResourceConfig, Session, create_resource_app
from services.core.schemas import VerifyReply, VerifyRequest

from .extract import (DEFAULT_PATTERNS, GRADING_MODES, NEMO_GYM_DEFAULT_MODE, OptionsError, compile_patterns,
                      extract_letter, normalize_expected, normalize_options)


class Config(ResourceConfig):
    workers: int = Field(1, ge=0, description="worker processes for row-supplied regexes and long responses")
    patterns: list[str] = Field(list(DEFAULT_PATTERNS), min_length=1,
                                description="regexes tried in order; group 1 is the letter (last match wins)")
    honor_row_grading_mode: bool = Field(True, description="use a NeMo-Gym row's grading_mode when present")
    honor_row_regex: bool = Field(True, description="use a row's template_metadata.output_regex first")
    inline_max_chars: int = Field(16_000, gt=0, description="longer responses are searched in the worker pool "
                                  "(about 2 ms of event-loop time at most inline)")
    max_response_chars: int = Field(2_000_000, gt=0, description="only the last this-many characters are searched")

    @field_validator("patterns")
    @classmethod
    def _valid(cls, value: list[str]) -> list[str]:
        compile_patterns(value)
        return value


def _row_value(request: VerifyRequest, name: str) -> Any:
    value = request.field(name)
    if value is None:
        metadata = request.field("metadata")
        if isinstance(metadata, dict):
            value = metadata.get(name)
    return value


def extract_job(text: str, options: dict[str, str], patterns: list[str], rule: str | None,
                row_regexes: list[str]) -> str | None:
    """Worker-side extraction (module-level so the pool can pickle it)."""
    return extract_letter(text, options, compile_patterns(patterns), rule,
                          compile_patterns(row_regexes, flags=re.IGNORECASE))


class MCQARequest(VerifyRequest):
    options: list[dict[str, str]] | dict[str, str] | None = Field(
        None, description='the choices, e.g. [{"A": "Venus"}, {"B": "Mars"}] (or under metadata, or `choices`)')
    choices: list[Any] | dict[str, Any] | None = Field(None, description="alternative name for options")
    expected_answer: str | None = Field(None, description="the right option letter (or under metadata)")
    grading_mode: str | None = Field(None, description="NeMo-Gym grading mode of the row")
    template_metadata: Any = Field(None, description="NeMo-Gym: {output_regex} that extracts the letter")
    metadata: Any = Field(None, description="may hold options and expected_answer instead of the top level")


class MCQAReply(VerifyReply):
    extracted_answer: str | None = Field(None, description="the option letter found in the response")


class MCQA(Environment):
    reverify_mode = "stateless"  # /verify is a pure function of its body
    config_model = Config
    request_model = MCQARequest
    reply_model = MCQAReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "Red planet? A: Venus B: Mars"}]},
                   "options": [{"A": "Venus"}, {"B": "Mars"}], "expected_answer": "B"}
    example_answer = "Mars is red. Answer: B"
    needs_pool = True
    description = "Multiple choice: reward 1.0 when the chosen option letter equals expected_answer."
    config: Config

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self._default = compile_patterns(config.patterns)

    def _rules(self, request: VerifyRequest) -> tuple[list[str], list[str], str | None]:
        """(row regexes, patterns, rule) for this row.

        A NeMo-Gym row (one with a grading mode or template metadata) is graded as NeMo-Gym grades
        it: its regexes first, then its grading mode (NeMo-Gym's default: strict boxed letter).
        """
        row_regexes: list[str] = []
        template = request.field("template_metadata")
        if self.config.honor_row_regex and isinstance(template, dict) and template.get("output_regex") is not None:
            regex = template["output_regex"]
            row_regexes = [regex] if isinstance(regex, str) else regex
            if not isinstance(row_regexes, list) or not all(isinstance(r, str) for r in row_regexes):
                raise BadRequest("template_metadata.output_regex: expected a string or a list of strings")
            try:
                compile_patterns(row_regexes, where="template_metadata.output_regex")
            except ValueError as exc:
                raise BadRequest(str(exc)) from None
        mode = request.field("grading_mode")
        if mode is None and row_regexes:
            mode = NEMO_GYM_DEFAULT_MODE
        if self.config.honor_row_grading_mode and mode is not None:
            if not isinstance(mode, str) or mode not in GRADING_MODES:
                raise BadRequest(f"grading_mode: unknown mode {mode!r}; known: {sorted(GRADING_MODES)}")
            mode_patterns, rule = GRADING_MODES[mode]
            return row_regexes, list(mode_patterns), rule
        return row_regexes, list(self.config.patterns), None

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        raw_options = next((v for v in (_row_value(request, "options"), request.field("choices")) if v is not None),
                           None)
        if raw_options is None:
            raise BadRequest("options: missing (the row needs options, e.g. [{\"A\": \"...\"}, {\"B\": \"...\"}])")
        try:
            options = normalize_options(raw_options)
            expected = normalize_expected(_row_value(request, "expected_answer"), options)
        except OptionsError as exc:
            raise BadRequest(str(exc)) from None
        row_regexes, patterns, rule = self._rules(request)
        text = request.text()[-self.config.max_response_chars:]
        if not row_regexes and len(text) <= self.config.inline_max_chars:  # a row's regex is untrusted
            compiled = self._default if patterns == self.config.patterns else compile_patterns(patterns)
            chosen = extract_letter(text, options, compiled, rule)
        else:
            try:
                chosen = await self.in_pool(extract_job, text, options, patterns, rule, row_regexes)
            except (WorkerFailure, TaskError) as exc:
                return exception_reply(request, exc, "answer extraction")
        return scored_reply(request, float(chosen == expected), extracted_answer=chosen)


def build(config: Config) -> FastAPI:
    return create_resource_app(MCQA(config))
