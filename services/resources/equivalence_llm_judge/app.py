"""equivalence_llm_judge: a judge model decides whether the response's answer is equivalent to the
row's `expected_answer` (NeMo-Gym's environment of that name: its row fields, prompt fields and labels).

Short free-form answers ("darwin" vs "Charles Darwin") that no string or math check can decide.
The options and their semantics are NeMo-Gym's (per-row answer regexes, the swap check against a
judge's positional bias, the partial-credit rescue with the whole response), so its configs carry over.
"""
from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from pydantic import Field, field_validator, model_validator

from services.core.errors import BadRequest
from services.core.judge import (judge_failed_reply, JudgedEnvironment, JudgeFailure, label_parser, Parser,
                                 PromptTemplate, TemplatedJudgeConfig)
from services.core.replies import scored_reply
from services.core.resource import Session, create_resource_app
from services.core.schemas import MessageItem, ResponseObject, VerifyReply, VerifyRequest

JUDGE_SYSTEM_MESSAGE = """You grade a candidate answer against a GOLD reference answer to a question.
Decide whether they are equivalent: the same fact, value, entity or set of parts, whatever the wording, \
spelling variants, abbreviations or formatting. A candidate that adds a wrong claim, or misses a part \
the GOLD requires, is not equivalent. Explain briefly, then end with exactly one verdict label:
- equivalent: [[A=B]]
- not equivalent: [[A!=B]]"""
JUDGE_PROMPT_TEMPLATE = "QUESTION:\n{question}\n\nGOLD:\n{expected_answer}\n\nCANDIDATE:\n{generated_answer}"
JUDGE_FIELDS = ("question", "expected_answer", "generated_answer")


class Config(TemplatedJudgeConfig):
    judge_system_message: str | None = Field(JUDGE_SYSTEM_MESSAGE, description="the judge's system message")
    judge_prompt_template: str = Field(JUDGE_PROMPT_TEMPLATE, description="the judge's user message; fields "
                                                                          "{question}, {expected_answer}, "
                                                                          "{generated_answer}")
    judge_equal_label: str = Field("[[A=B]]", min_length=1, description="the judge's label for equivalent")
    judge_not_equal_label: str = Field("[[A!=B]]", min_length=1, description="the judge's label for different")
    check_twice_swap: bool = Field(False, description="after an equal verdict, ask again with the answers swapped")
    reward_if_swap_fails: float = Field(0.0, description="reward when the swapped question says not equal")
    response_extract_regex: str | None = Field(None, description="the answer is the last match (its first "
                                                                 "non-empty group) in the response; none: all")
    question_extract_regex: str | None = Field(None, description="the question is the last match in the last "
                                                                 "user message; none: all of it")
    max_answer_chars: int | None = Field(None, gt=0, description="a longer final answer scores 0 without a "
                                                                 "judge call; none: no limit")
    use_per_record_regex: bool = Field(True, description="a row's template_metadata.output_regex replaces "
                                                         "response_extract_regex")
    extraction_length_threshold: int | None = Field(
        120, gt=0, description="with a row's output_regex: an expected_answer longer than this is judged against "
                               "the whole response, with no swap or rescue question; none: always extract")
    check_full_generation_on_fail: bool = Field(
        True, description="with a row's output_regex: after a not-equal verdict, ask again with the whole response")
    reward_if_full_generation_succeeds: float = Field(0.5, description="reward when only the whole response "
                                                                       "is judged equal")

    @field_validator("response_extract_regex", "question_extract_regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _check(self) -> "Config":
        if self.judge_model_server is None:
            raise ValueError("judge_model_server: missing (an instance name, "
                             "{type: responses_api_models, name: ...} or a URL)")
        if self.judge_equal_label == self.judge_not_equal_label:
            raise ValueError("judge_not_equal_label: must differ from judge_equal_label")
        PromptTemplate(self.judge_prompt_template, self.judge_system_message, fields=JUDGE_FIELDS)
        return self


class EquivalenceRequest(VerifyRequest):
    """`/verify` body: the row's `expected_answer` (or `metadata.expected_answer`) plus the model's response."""

    expected_answer: str | int | float | None = Field(None, description="the reference answer")
    template_metadata: dict[str, Any] | None = Field(None, description="`output_regex`: this row's answer regex")


class EquivalenceReply(VerifyReply):
    """Adds `extracted_answer` (what the judge was shown) and `judge_evaluations` (one per judge question)."""

    extracted_answer: str | None = None
    judge_evaluations: list[dict[str, Any]] | None = None


def last_match(text: str, pattern: str | None) -> str:
    """`text`, or the last match of `pattern` in it (its first non-empty group); no match, or a row's
    pattern that is not a regular expression: `text`."""
    if not pattern:
        return text
    try:
        matches = list(re.finditer(pattern, text, flags=re.MULTILINE | re.DOTALL))
    except re.error:
        return text
    if not matches:
        return text
    last = matches[-1]
    for group in last.groups():
        if group and group.strip():
            return group.strip()
    return last.group(0).strip()


def final_answer_text(response: ResponseObject) -> str:
    """The last assistant message's text parts, one per line (reasoning items are not the answer)."""
    for item in reversed(response.output):
        if isinstance(item, MessageItem) and item.role == "assistant":
            if isinstance(item.content, str):
                return item.content.strip()
            return "\n".join(p["text"] for p in item.content if isinstance(p.get("text"), str)).strip()
    return ""


def prompt_question(request: VerifyRequest) -> str:
    """The last user message with text (its text parts one per line): the question the judge is shown."""
    for message in reversed(request.responses_create_params.input_messages()):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content.strip()
        texts = [p["text"] for p in content or [] if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if texts:
            return "\n".join(texts).strip()
    return ""


def expected_answer(request: VerifyRequest) -> str:
    """The row's `expected_answer`, else `metadata.expected_answer`; none is a 400."""
    expected = request.field("expected_answer")
    if expected is None or expected == "":
        metadata = request.field("metadata")
        expected = metadata.get("expected_answer") if isinstance(metadata, dict) else None
    if isinstance(expected, bool) or not isinstance(expected, (str, int, float)) or not str(expected).strip():
        raise BadRequest("expected_answer: missing, empty, or not a string")
    return str(expected)


class EquivalenceLLMJudge(JudgedEnvironment):
    config_model = Config
    request_model = EquivalenceRequest
    reply_model = EquivalenceReply
    example_row = {"responses_create_params": {"input": [{"role": "user", "content": "Who proposed the theory of "
                                                          "evolution by natural selection?"}]},
                   "expected_answer": "Charles Darwin"}
    example_answer = "Darwin"
    description = "Reward 1.0 when a judge model finds the response's answer equivalent to expected_answer."
    config: Config
    judge_fields = JUDGE_FIELDS

    async def verify(self, request: VerifyRequest, session: Session | None) -> VerifyReply:
        config = self.config
        expected = expected_answer(request)
        text = final_answer_text(request.response)
        if not text or (config.max_answer_chars is not None and len(text) > config.max_answer_chars):
            # nothing to judge, or too long to: the model's fault, a 0 without asking the judge
            return scored_reply(request, 0.0, extracted_answer=None, judge_evaluations=[])
        metadata = request.field("template_metadata")
        row_regex = metadata.get("output_regex") if config.use_per_record_regex and isinstance(metadata, dict) \
            else None
        row_regex = row_regex if isinstance(row_regex, str) else None
        long_expected = bool(row_regex) and config.extraction_length_threshold is not None \
            and len(expected) > config.extraction_length_threshold  # judged whole: no swap, no rescue question
        pattern = None if long_expected else row_regex or config.response_extract_regex
        answer = last_match(text, pattern)
        question = last_match(prompt_question(request), config.question_extract_regex)
        records: list[dict[str, Any]] = []

        async def equal(expected_side: str, generated_side: str) -> bool:
            values = {"question": question, "expected_answer": expected_side, "generated_answer": generated_side}
            evaluation = await self.judge.ask(self.template.messages(**values), self.parse)
            records.append(evaluation.record())
            return evaluation.verdict == config.judge_equal_label

        try:
            if not await equal(expected, answer):
                reward = 0.0
                if row_regex and config.check_full_generation_on_fail and not long_expected:
                    reward = config.reward_if_full_generation_succeeds if await equal(expected, text) else 0.0
            elif config.check_twice_swap and not long_expected:
                reward = 1.0 if await equal(answer, expected) else config.reward_if_swap_fails
            else:
                reward = 1.0
        except JudgeFailure as exc:
            exc.evaluations = records + exc.evaluations
            return judge_failed_reply(request, exc, extracted_answer=answer)
        return scored_reply(request, reward, extracted_answer=answer, judge_evaluations=records)

    def verdict_markers(self) -> tuple[str, ...]:
        return (self.config.judge_equal_label, self.config.judge_not_equal_label)

    @property
    def parse(self) -> Parser:
        return label_parser(self.config.judge_equal_label, self.config.judge_not_equal_label)


def build(config: Config) -> FastAPI:
    return create_resource_app(EquivalenceLLMJudge(config))
