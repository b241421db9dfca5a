"""LLM-as-judge: one mechanism for every environment that asks a model for a verdict.

A judge is any OpenAI-compatible model server, named by its instance in the stack (resolved
through the head, like an agent's model server) or by a URL (vLLM, a hosted API behind
`models/openai_proxy`). Why each part exists:

- prompts are templates with named fields, checked when the server starts, so a typo in a
  field name is a config error, not a judge call with a literal `{qestion}` in it;
- verdicts are parsed strictly: a reply with no verdict label, or with two different ones, is a
  masked failure (`upstream`) with its own reason, never a reward of 0;
- so that only the judge can write a verdict, every value put into a prompt (the policy's answer,
  and the row's fields too) has its verdict markers broken up (`[[A=B]]` becomes `[ [A=B] ]`): an
  answer that carries a label cannot have a judge that quotes it give two verdicts (a masked sample
  the policy caused) nor one the judge did not reach;
- a deadline covers the whole call (retries and waits included); transport errors, 429 (after
  its `Retry-After`) and 502/503/504 are retried with backoff a bounded number of times;
- a concurrency bound and an optional token-bucket rate per judge (hosted judges are rate-limited);
- a cache keyed by (judge, prompt): re-verifying a rollout does not call the judge again, and
  identical concurrent questions share one call;
- per-judge metrics (calls, latency, cache hits, verdicts, failures) on the server's `/metrics`.
"""
from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import random
import re
import string
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Literal

from pydantic import BaseModel, Field, field_validator

from .auth import trust
from .content import content_text
from .client import ServiceClient, retry_after, shared_client
from .directory import Directory
from .errors import UpstreamError
from .failures import FailureKind
from .metrics import JudgeMetrics
from .replies import failed_reply
from .resource import Environment, ResourceConfig
from .schemas import VerifyReply, VerifyRequest, response_text

RETRY_STATUSES = frozenset({429, 502, 503, 504})


class ModelServerRef(BaseModel):
    """A model server instance of the stack (NeMo-Gym's `{type: responses_api_models, name: ...}`)."""

    type: Literal["responses_api_models"] = "responses_api_models"
    name: str = Field(min_length=1, description="the model server's instance name in the stack")


class JudgeConfig(ResourceConfig):
    """Options of an environment that calls a judge (every judged environment has these)."""

    judge_model_server: ModelServerRef | str | None = Field(
        None, description="the judge: {type: responses_api_models, name: INSTANCE} (resolved through the head), "
                          "an instance name, or a base URL such as http://127.0.0.1:8000")
    judge_api: Literal["responses", "chat_completions"] = Field(
        "responses", description="the judge's endpoint: /v1/responses or /v1/chat/completions")
    judge_responses_create_params: dict[str, Any] = Field(
        default_factory=dict, description="extra request fields for every judge call (model, temperature, "
                                          "max_output_tokens, ...); the prompt replaces `input`/`messages`")
    judge_deadline_s: float = Field(60.0, gt=0, description="deadline of one judge question, retries included")
    judge_retries: int = Field(2, ge=0, le=10, description="retries after a transport error, 429, 502, 503 or 504")
    judge_backoff_s: float = Field(0.2, gt=0, description="first retry delay (doubles each retry, with jitter)")
    judge_endpoint_max_concurrency: int = Field(64, gt=0, description="judge calls in flight at once")
    judge_rate_per_s: float | None = Field(None, gt=0, description="token-bucket rate of judge calls; none: unlimited")
    judge_rate_burst: int = Field(1, gt=0, description="calls the token bucket lets through at once")
    judge_cache_size: int = Field(100_000, ge=0, description="verdicts kept per judge, keyed by prompt; 0: no cache")

    @field_validator("judge_model_server", mode="before")
    @classmethod
    def _ref(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            raise ValueError("empty: give an instance name, {type, name} or a URL")
        return value


# Training data a policy server in training mode attaches to output items: of no use in a judge's record.
TOKEN_DATA = frozenset({"prompt_token_ids", "generation_token_ids", "generation_log_probs"})


def without_token_data(response: dict[str, Any]) -> dict[str, Any]:
    """`response` without token IDs and logprobs on its output items (the policy can be the judge)."""
    output = response.get("output")
    if not isinstance(output, list) or not any(isinstance(i, dict) and TOKEN_DATA & i.keys() for i in output):
        return response
    items = [{k: v for k, v in i.items() if k not in TOKEN_DATA} if isinstance(i, dict) else i for i in output]
    return {**response, "output": items}


def judge_target(config: JudgeConfig) -> str | None:
    """The judge's instance name or URL as one string (the metrics label and the cache key's prefix)."""
    ref = config.judge_model_server
    if ref is None:
        return None
    return ref.name if isinstance(ref, ModelServerRef) else ref.strip().rstrip("/")


# --------------------------------------------------------------------------- #
# Prompt templates and verdicts
# --------------------------------------------------------------------------- #
VERDICT_MARKERS = ("[[", "]]")  # every built-in label and score is bracketed so


def defuse(text: str, markers: tuple[str, ...] = VERDICT_MARKERS) -> str:
    """`text` with each marker (two characters or more) broken up by a space after its first character,
    until none is left: what a judge quotes from it can no longer be parsed as a verdict."""
    usable = sorted({m for m in markers if len(m) >= 2 and not m[0].isspace()}, key=len, reverse=True)
    for _ in range(len(text) + 1):
        hit = next((m for m in usable if m in text), None)
        if hit is None:
            return text
        text = text.replace(hit, hit[0] + " " + hit[1:])
    return text


class PromptTemplate:
    """A system message (optional) and a user message with `{named}` fields; the values are `defuse`d
    against `markers` (the verdict labels the judge's reply is parsed for, plus the brackets)."""

    def __init__(self, user: str, system: str | None = None, *, fields: tuple[str, ...] | None = None,
                 where: str = "judge_prompt_template", markers: tuple[str, ...] = VERDICT_MARKERS) -> None:
        self.user = user
        self.system = system or None
        self.markers = tuple(dict.fromkeys((*VERDICT_MARKERS, *markers)))
        self.fields = tuple(dict.fromkeys(_field_names(user, where) + _field_names(system or "", where)))
        unknown = sorted(set(self.fields) - set(fields)) if fields is not None else []
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; "
                             f"allowed: {', '.join(fields or ())}")

    def messages(self, **values: str) -> list[dict[str, str]]:
        """The chat messages for `values` (every field of the template must be given)."""
        missing = [name for name in self.fields if name not in values]
        if missing:
            raise KeyError(f"prompt fields not given: {', '.join(missing)}")
        values = {k: defuse(v, self.markers) if isinstance(v, str) else v for k, v in values.items()}
        out = []
        if self.system:
            out.append({"role": "system", "content": self.system.format_map(values)})
        out.append({"role": "user", "content": self.user.format_map(values)})
        return out


def _field_names(template: str, where: str) -> list[str]:
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ValueError(f"{where}: {exc} (write a literal brace as {{{{ or }}}})") from None
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise ValueError(f"{where}: fields must be plain names, got {{{bad[0]}}}")
    return names


class UnparseableVerdict(ValueError):
    """The judge answered, but not with exactly one verdict."""


Parser = Callable[[str], str]


def label_parser(*choices: str) -> Parser:
    """A parser for a reply that must hold exactly one of `choices` (see `parse_label`)."""
    return functools.partial(parse_label, labels=choices)


_SCORE = re.compile(r"\[\[\s*(?:score\s*[:=]\s*)?([-+]?\d+(?:\.\d+)?)\s*\]\]", re.IGNORECASE)


def score(low: float, high: float) -> Parser:
    """A parser for a reply that holds one score `[[N]]` (or `[[score: N]]`) between `low` and `high`;
    the same score repeated counts once, two different ones or one out of range are unparseable."""
    def parse(text: str) -> str:
        found = {float(m) for m in _SCORE.findall(text)}
        if not found:
            raise UnparseableVerdict(f"no score [[N]] ({low:g} to {high:g}) in the judge's reply")
        if len(found) > 1:
            raise UnparseableVerdict(f"conflicting scores ({', '.join(f'{v:g}' for v in sorted(found))}) "
                                     "in the judge's reply")
        value = found.pop()
        if not low <= value <= high:
            raise UnparseableVerdict(f"score {value:g} outside the scale {low:g} to {high:g}")
        return f"{value:g}"
    return parse


def parse_label(text: str, labels: tuple[str, ...]) -> str:
    """The one verdict label that `text` contains (it may repeat); none, or two different ones, is an
    UnparseableVerdict. A label that is part of a longer one (`[[A=B]]` in `[[A=B]]x`) still counts once."""
    found = []
    for label in sorted(labels, key=len, reverse=True):  # longest first: consume it before its substrings
        if label in text:
            found.append(label)
            text = text.replace(label, "")
    if not found:
        raise UnparseableVerdict(f"no verdict label ({' or '.join(labels)}) in the judge's reply")
    if len(found) > 1:
        raise UnparseableVerdict(f"conflicting verdict labels ({', '.join(found)}) in the judge's reply")
    return found[0]


# --------------------------------------------------------------------------- #
# The judge client
# --------------------------------------------------------------------------- #
class JudgeFailure(UpstreamError):
    """The judge could not give a verdict (down, slow, garbage): the sample is masked."""

    def __init__(self, message: str, *, kind: FailureKind = FailureKind.UPSTREAM,
                 evaluations: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message, kind=kind)
        self.evaluations = list(evaluations or [])


class _Abandoned(Exception):
    """The request that asked a shared question went away (its client disconnected) before the answer."""


@dataclass
class Evaluation:
    """One judge question and its answer: what goes into a reply's `judge_evaluations`."""

    verdict: str
    text: str
    request: dict[str, Any]
    response: dict[str, Any]
    cached: bool = False  # answered from the cache (not in the record: a re-verify must give the same reply)

    def record(self) -> dict[str, Any]:
        return {"responses_create_params": self.request, "response": self.response, "verdict_label": self.verdict}


class TokenBucket:
    """`rate` calls per second on average, at most `burst` at once."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.lock = asyncio.Lock()

    async def take(self, deadline: float) -> None:
        """Wait for a token; a wait that would pass `deadline` raises TimeoutError at once."""
        async with self.lock:  # first come, first served
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            wait = max(0.0, (1.0 - self.tokens) / self.rate)
            if now + wait > deadline:
                raise TimeoutError(f"the judge's rate limit ({self.rate}/s) leaves no room before the deadline")
            self.tokens -= 1.0
            if wait:
                await asyncio.sleep(wait)


class Judge:
    """Asks one judge model; shared by all verifies of an environment."""

    def __init__(self, config: JudgeConfig, *, metrics: JudgeMetrics | None = None,
                 client: ServiceClient | None = None) -> None:
        target = judge_target(config)
        if target is None:
            raise ValueError("judge_model_server: missing (the judge model server: an instance name or a URL)")
        self.config = config
        self.target = target
        self.fixed_url = target if target.startswith(("http://", "https://")) else None
        if self.fixed_url:
            trust(self.fixed_url)  # a URL in the server's own configuration is the stack's: it gets the key
        self.client = client or shared_client()
        self.directory = Directory(config.head_url, client=self.client)
        self.metrics = metrics
        self.path = "/v1/responses" if config.judge_api == "responses" else "/v1/chat/completions"
        self._slots = asyncio.Semaphore(config.judge_endpoint_max_concurrency)
        self._bucket = TokenBucket(config.judge_rate_per_s, config.judge_rate_burst) if config.judge_rate_per_s else None
        self._cache: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[tuple[str, dict[str, Any]]]] = {}

    def request_body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        body = {k: v for k, v in self.config.judge_responses_create_params.items() if k not in ("input", "messages")}
        if self.config.judge_api == "responses":
            body["input"] = messages
        else:
            body["messages"] = messages
            if "max_output_tokens" in body:
                body["max_tokens"] = body.pop("max_output_tokens")
        return body

    async def ask(self, messages: list[dict[str, str]], parse: Parser) -> Evaluation:
        """The judge's verdict on `messages`, as `parse` reads it from the reply text (`label_parser`, `score`);
        raises JudgeFailure when there is none."""
        body = self.request_body(messages)
        key = hashlib.sha256(json.dumps([self.target, self.path, body], sort_keys=True).encode()).hexdigest()
        while True:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self._observe_hit()
                return self._evaluation(body, *hit, parse, cached=True)
            pending = self._inflight.get(key)
            if pending is None:
                break
            try:  # the same question is being asked right now: share its answer
                text, response = await asyncio.shield(pending)
            except _Abandoned:
                continue  # its asker was cancelled (its client went away): look again, ask it ourselves
            self._observe_hit()
            return self._evaluation(body, text, response, parse, cached=True)
        future: asyncio.Future[tuple[str, dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            text, response = await self._call(body)
            evaluation = self._evaluation(body, text, response, parse, cached=False)
        except BaseException as exc:
            shared = exc if isinstance(exc, Exception) else _Abandoned()
            future.set_exception(shared)
            future.exception()  # retrieved: no "never retrieved" warning when nobody shared it
            raise
        finally:
            self._inflight.pop(key, None)
        future.set_result((text, response))
        if self.config.judge_cache_size:  # only parseable answers are kept: a garbled one may be asked again
            self._cache[key] = (text, response)
            while len(self._cache) > self.config.judge_cache_size:
                self._cache.popitem(last=False)
        return evaluation

    def _evaluation(self, body: dict[str, Any], text: str, response: dict[str, Any], parse: Parser,
                    *, cached: bool) -> Evaluation:
        try:
            verdict = parse(text)
        except UnparseableVerdict as exc:
            self._observe_failure("unparseable")
            record = {"responses_create_params": body, "response": response, "verdict_label": None}
            raise JudgeFailure(f"judge {self.target}: {exc}: {text[:300]!r}", evaluations=[record]) from None
        if self.metrics:
            self.metrics.verdicts.labels(judge=self.target, verdict=verdict).inc()
        return Evaluation(verdict=verdict, text=text, request=body, response=response, cached=cached)

    async def _call(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """One judge question with the deadline, the rate, the concurrency bound and the retries."""
        config = self.config
        deadline = time.monotonic() + config.judge_deadline_s
        started = time.monotonic()
        outcome = "ok"
        try:
            if self._bucket is not None:
                await self._bucket.take(deadline)
            async with self._slots:
                return await self._attempts(body, deadline)
        except TimeoutError as exc:
            outcome = "timeout"
            raise JudgeFailure(f"judge {self.target}: {exc}", kind=FailureKind.TIMEOUT) from None
        except JudgeFailure as exc:
            outcome = exc.kind.value
            raise
        finally:
            if self.metrics:
                self.metrics.calls.labels(judge=self.target, outcome=outcome).inc()
                self.metrics.latency.labels(judge=self.target).observe(time.monotonic() - started)
                if outcome != "ok":
                    self.metrics.failures.labels(judge=self.target, reason=outcome).inc()

    async def _attempts(self, body: dict[str, Any], deadline: float) -> tuple[str, dict[str, Any]]:
        attempts = 1 + self.config.judge_retries
        last = "no attempt made"
        for attempt in range(attempts):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            wait = 0.0
            try:
                base = self.fixed_url or await self.directory.url(self.target)
                reply = await self.client.request("POST", base + self.path, json=body, deadline_s=remaining, retries=0)
            except UpstreamError as exc:
                if exc.kind == FailureKind.TIMEOUT:
                    raise JudgeFailure(f"judge {self.target}: no answer within {self.config.judge_deadline_s:g}s "
                                       f"(judge_deadline_s): {exc.message}", kind=FailureKind.TIMEOUT) from None
                last = exc.message
                if not self.fixed_url:
                    self.directory.invalidate(self.target)  # a restarted judge may be elsewhere now
            else:
                if reply.status_code == 200:
                    return self._answer(reply.content)
                last = f"answered {reply.status_code}: {reply.text[:300]}"
                if reply.status_code not in RETRY_STATUSES:
                    break  # a 4xx other than 429 will not get better by asking again
                wait = retry_after(reply)
            if attempt + 1 == attempts:
                break
            delay = max(wait, min(5.0, self.config.judge_backoff_s * 2 ** attempt) * (0.5 + random.random()))
            if time.monotonic() + delay >= deadline:
                raise JudgeFailure(f"judge {self.target}: deadline ({self.config.judge_deadline_s:g}s) leaves no "
                                   f"room for a retry after: {last}", kind=FailureKind.TIMEOUT)
            await asyncio.sleep(delay)
        raise JudgeFailure(f"judge {self.target}: {last}")

    def _answer(self, content: bytes) -> tuple[str, dict[str, Any]]:
        try:
            response = json.loads(content)
        except ValueError:
            raise JudgeFailure(f"judge {self.target}: reply is not JSON: {content[:200]!r}") from None
        if not isinstance(response, dict):
            raise JudgeFailure(f"judge {self.target}: reply is not a JSON object")
        response = without_token_data(response)
        if self.config.judge_api == "responses":
            if not isinstance(response.get("output"), list):
                raise JudgeFailure(f"judge {self.target}: reply has no `output` list (not a Responses object)")
            try:
                text = response_text(response)
            except ValueError as exc:
                raise JudgeFailure(f"judge {self.target}: malformed output: {exc}") from None
        else:
            try:
                text = response["choices"][0]["message"]["content"]
            except (KeyError, IndexError, TypeError):
                raise JudgeFailure(f"judge {self.target}: reply has no choices[0].message.content") from None
            if not isinstance(text, str):
                raise JudgeFailure(f"judge {self.target}: choices[0].message.content is not text")
        return text, response

    def _observe_hit(self) -> None:
        if self.metrics:
            self.metrics.cache_hits.labels(judge=self.target).inc()

    def _observe_failure(self, reason: str) -> None:
        if self.metrics:
            self.metrics.failures.labels(judge=self.target, reason=reason).inc()


EQUAL_LABEL = "[[A=B]]"
NOT_EQUAL_LABEL = "[[A!=B]]"
EQUIVALENCE_LABELS = (EQUAL_LABEL, NOT_EQUAL_LABEL)


async def equal_in_orders(judge: Judge, template: PromptTemplate, orders: list[dict[str, str]], *,
                          equal: str = EQUAL_LABEL, choices: tuple[str, ...] = EQUIVALENCE_LABELS
                          ) -> tuple[bool, list[dict[str, Any]]]:
    """Ask whether two answers are equal, once per order of `orders` (a judge has a positional bias),
    stopping at the first "not equal". Returns (all said equal, one record per judge question); a
    JudgeFailure carries the records made before it."""
    records: list[dict[str, Any]] = []
    parse = label_parser(*choices)
    for values in orders:
        try:
            evaluation = await judge.ask(template.messages(**values), parse)
        except JudgeFailure as exc:
            exc.evaluations = records + exc.evaluations
            raise
        records.append(evaluation.record())
        if evaluation.verdict != equal:
            return False, records
    return True, records


def judge_failed_reply(request: VerifyRequest, exc: JudgeFailure, **fields: Any) -> VerifyReply:
    """The masked reply for a verify whose judge gave no verdict, with the judge questions asked so far."""
    return failed_reply(request, exc.kind, exc.message, judge_evaluations=exc.evaluations, **fields)


def question_text(request: VerifyRequest) -> str:
    """The row's `question`, else the last user message of the prompt (what the judge is shown)."""
    question = request.field("question")
    if isinstance(question, str) and question.strip():
        return question
    for message in reversed(request.responses_create_params.input_messages()):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""



class TemplatedJudgeConfig(JudgeConfig):
    """Options of an environment whose reward is a judge's verdict: its prompt (each environment sets defaults)."""

    judge_system_message: str | None = Field(None, description="the judge's system message")
    judge_prompt_template: str = Field(..., description="the judge's user message, with {named} fields")


class JudgedEnvironment(Environment):
    """An environment scored by a judge model: the prompt template is checked when the server is built, the judge
    (client, cache, rate, metrics) made once at start-up."""

    judge_fields: tuple[str, ...] = ()
    config: TemplatedJudgeConfig
    judge: Judge
    template: PromptTemplate

    def __init__(self, config: TemplatedJudgeConfig) -> None:
        super().__init__(config)
        self.template = PromptTemplate(config.judge_prompt_template, config.judge_system_message,
                                       fields=self.judge_fields, markers=self.verdict_markers())

    def verdict_markers(self) -> tuple[str, ...]:
        """What the judge's reply is parsed for, to be broken up in every prompt value (environments with
        configurable labels add theirs)."""
        return VERDICT_MARKERS

    async def startup(self) -> None:
        await super().startup()
        self.judge = Judge(self.config, metrics=self.metrics.judges if self.metrics else None)
