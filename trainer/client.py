"""Routing client: send a dataset row to the agent named by its `agent_ref` (`POST /run`).

Agents are found by instance name through the head (`/server_instances`), re-resolved
when a call cannot reach them (a restarted server may come back on another port). An agent
whose registered URL is not reachable from here (a trainer outside a compose network) is
called through the head's proxy instead, with no option to set (services/core/directory.py).
Every rollout has one deadline covering all retries; only transport failures are
retried. A rollout that fails is returned as a failure record (masked, with
`failure_kind`/`failure_reason`), never as reward 0. Rollouts run in GRPO groups (the rows of
one task): a finished group whose environment defines its reward over the group is re-scored
there (trainer/group_rewards.py), the one path `gymserve collect`, TRL's `rollout_func` and
`gymserve train` share.
"""
from __future__ import annotations

import asyncio
import copy
import json
import os
import threading
import time
import uuid
from typing import Any, Awaitable, Callable, Iterable, TypeVar

from services.agents.checkpoint import ROLLOUT_HEADER
from services.core.auth import adopt_default_key
from services.core.client import ServiceClient
from services.core.redaction import redact_text
from services.core.directory import Directory
from services.core.errors import UpstreamError
from services.core.failures import FailureKind, as_kind

from .group_rewards import GroupRewards
from .tokens import policy_version

DEFAULT_HEAD_URL = "http://127.0.0.1:11000"
T = TypeVar("T")


def default_head_url() -> str:
    return os.environ.get("GYMSERVE_HEAD_URL") or DEFAULT_HEAD_URL


def agent_name(row: dict[str, Any]) -> str | None:
    ref = row.get("agent_ref")
    if isinstance(ref, dict) and isinstance(ref.get("name"), str) and ref["name"]:
        return ref["name"]
    return None


def route_to(rows: list[dict[str, Any]], agent: str) -> tuple[list[dict[str, Any]], int]:
    """Every row sent to `agent` (NeMo-Gym's `+agent_name`: rows need no `agent_ref`, and one they
    carry is overridden); also how many rows named another agent."""
    ref = {"type": "responses_api_agents", "name": agent}
    overridden = sum(1 for row in rows if agent_name(row) not in (None, agent))
    return [{**row, "agent_ref": dict(ref)} for row in rows], overridden


def failure_record(row: dict[str, Any], kind: FailureKind, reason: str) -> dict[str, Any]:
    """The row with the failure marked: masked, no reward (a missing reward is not a 0)."""
    record = dict(row)
    record.update(reward=None, mask_sample=True, failure_kind=str(kind), failure_reason=redact_text(reason)[:2000])
    record.setdefault("policy_version", None)
    return record


BATCH_DEADLINE_REASON = "batch deadline passed"


def cut_by_batch_deadline(record: dict[str, Any]) -> bool:
    """Whether this failure record is a rollout cancelled at its batch's deadline."""
    return record.get("failure_kind") == str(FailureKind.TIMEOUT) and \
        str(record.get("failure_reason", "")).startswith(BATCH_DEADLINE_REASON)


def is_failure(record: dict[str, Any]) -> bool:
    return bool(record.get("mask_sample")) or record.get("reward") is None


def group_rows(rows: list[dict[str, Any]]) -> list[list[int]]:
    """Positions of `rows` by GRPO group: same agent and `_ng_task_index` (a row without one is alone)."""
    groups: dict[Any, list[int]] = {}
    for i, row in enumerate(rows):
        task = row.get("_ng_task_index")
        key = ("row", i) if task is None else ("task", agent_name(row), json.dumps(task, default=str))
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def expand_repeats(rows: Iterable[dict[str, Any]], repeats: int) -> list[dict[str, Any]]:
    """Each row `repeats` times, tagged `_ng_task_index` (row position) and `_ng_rollout_index`."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    out = []
    for task_index, row in enumerate(rows):
        for rollout_index in range(repeats):
            item = copy.deepcopy(row)
            item["_ng_task_index"] = task_index
            item["_ng_rollout_index"] = rollout_index
            out.append(item)
    return out


class RolloutClient:
    """Runs rows on their agents with a concurrency limit, a per-rollout deadline and bounded retries."""

    def __init__(self, head_url: str | None = None, *, agents: dict[str, str] | None = None,
                 concurrency: int = 32, deadline_s: float = 900.0, retries: int = 2,
                 client: ServiceClient | None = None) -> None:
        adopt_default_key()  # the key `gymserve up` generated, when none is given
        # its own pool sized to the concurrency: no more connections than rollouts in flight
        self._owns_client = client is None
        self.client = client or ServiceClient(max_connections=max(8, int(concurrency) + 4))
        self.directory = Directory(head_url if head_url is not None else (None if agents else default_head_url()),
                                   static=agents, client=self.client, via_head="auto")
        self.concurrency = max(1, int(concurrency))
        self.deadline_s = float(deadline_s)
        self.retries = max(0, int(retries))
        self._semaphore: asyncio.Semaphore | None = None
        self._semaphore_loop: asyncio.AbstractEventLoop | None = None
        self.groups = GroupRewards(self.directory, self.client, deadline_s=self.deadline_s, retries=self.retries)

    async def aclose(self) -> None:
        """Close the connection pool (when this client created it)."""
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> "RolloutClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def _limit(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._semaphore is None or self._semaphore_loop is not loop:
            self._semaphore = asyncio.Semaphore(self.concurrency)
            self._semaphore_loop = loop
        return self._semaphore

    async def resolve(self, name: str) -> str:
        """URL of agent `name`; a name the head does not know raises UpstreamError(kind=FailureKind.BAD_REQUEST)."""
        if name in self.directory.static:
            return self.directory.static[name].rstrip("/")
        instances = await self.directory.instances()
        if name not in instances:
            instances = await self.directory.instances(refresh=True)
        if name not in instances:
            known = sorted(n for n, v in instances.items() if "agent" in str(v.get("server_type", v.get("kind", ""))))
            raise UpstreamError(f"unknown agent {name!r}: no server of that name is registered with the head at "
                                f"{self.directory.head_url} (agents: {', '.join(known) or 'none'})", kind=FailureKind.BAD_REQUEST)
        return await self.directory.route(name, str(instances[name]["url"]).rstrip("/"))

    async def run(self, row: dict[str, Any]) -> dict[str, Any]:
        """One rollout: the agent's verify reply, or a failure record. Never raises for a bad row or server."""
        name = agent_name(row)
        if name is None:
            return failure_record(row, FailureKind.BAD_REQUEST, "row has no agent_ref.name: cannot route it to an agent")
        async with self._limit():
            try:
                reply = await self._run_with_retries(name, row)
            except UpstreamError as exc:
                return failure_record(row, as_kind(exc.kind, FailureKind.UPSTREAM), str(exc))
        return self._finish(row, reply)

    async def run_many(self, rows: list[dict[str, Any]], *, batch_deadline_s: float | None = None,
                       group_rewards: bool = True) -> list[dict[str, Any]]:
        """Rollouts for `rows`, in order (concurrently up to the limit), run and scored by GRPO group
        (`group_rewards=False`: each keeps its agent's verdict, for a caller that re-scores later).

        With `batch_deadline_s`, a rollout not finished that many seconds after the call is
        cancelled and masked as a `timeout`: one straggler cannot hold a training step hostage.
        """
        deadline_at = None if batch_deadline_s is None else time.monotonic() + batch_deadline_s
        if not group_rewards:
            return list(await asyncio.gather(*(self.run_until(row, deadline_at) for row in rows)))
        groups = group_rows(rows)
        done = await asyncio.gather(*(self.run_group([rows[i] for i in members], deadline_at) for members in groups))
        records: list[dict[str, Any]] = [{}] * len(rows)
        for members, group_records in zip(groups, done):
            for i, record in zip(members, group_records):
                records[i] = record
        return records

    async def run_group(self, rows: list[dict[str, Any]], deadline_at: float | None = None) -> list[dict[str, Any]]:
        """The rollouts of one GRPO group (rows of one task), scored together when their environment
        defines its reward over the group."""
        records = list(await asyncio.gather(*(self.run_until(row, deadline_at) for row in rows)))
        return await self.score_group(rows, records, deadline_at)

    async def rescore(self, rows: list[dict[str, Any]], records: list[dict[str, Any]],
                      changed: Iterable[int]) -> list[dict[str, Any]]:
        """`records` with every group that holds a changed position scored again (rollouts replaced
        after the group was scored: stale samples rolled out again on newer weights)."""
        out = list(records)
        changed = set(changed)
        for members in group_rows(rows):
            if changed.intersection(members):
                for i, record in zip(members, await self.score_group([rows[i] for i in members],
                                                                     [out[i] for i in members])):
                    out[i] = record
        return out

    async def score_group(self, rows: list[dict[str, Any]], records: list[dict[str, Any]],
                          deadline_at: float | None = None) -> list[dict[str, Any]]:
        """A finished group's records, re-scored by its environment when that defines a group
        reward (trainer/group_rewards.py); otherwise as they are."""
        records = list(records)
        name = agent_name(rows[0]) if rows else None
        members = [k for k, record in enumerate(records) if not is_failure(record)]
        if name is None or len(members) < 2:  # one rollout alone: the agent's verify is its group's verdict
            return records
        resource = await self.groups.group_server(name)
        if resource is None:
            return records
        replies = await self.groups.rescore(name, resource, [rows[k] for k in members],
                                            [records[k] for k in members], deadline_at)
        for k, reply in zip(members, replies):
            if isinstance(reply, dict):
                records[k] = self._finish(rows[k], reply)
            elif deadline_at is not None and time.monotonic() >= deadline_at:
                records[k] = failure_record(rows[k], FailureKind.TIMEOUT, f"{BATCH_DEADLINE_REASON}: {reply}")
            else:
                records[k] = failure_record(rows[k], FailureKind.UPSTREAM, reply)
        return records

    async def run_until(self, row: dict[str, Any], deadline_at: float | None) -> dict[str, Any]:
        """`run`, cancelled at `deadline_at` (a `time.monotonic()` value; None: no batch deadline)."""
        if deadline_at is None:
            return await self.run(row)
        try:
            return await asyncio.wait_for(self.run(row), max(0.0, deadline_at - time.monotonic()))
        except asyncio.TimeoutError:  # `run` never raises one itself: it returns failure records
            return failure_record(row, FailureKind.TIMEOUT,
                                  f"{BATCH_DEADLINE_REASON}: the rollout was still running, so it was cancelled")

    async def _run_with_retries(self, name: str, row: dict[str, Any]) -> Any:
        deadline = time.monotonic() + self.deadline_s
        last: UpstreamError | None = None
        # one name for every attempt: an agent that keeps checkpoints goes on where a dead replica stopped
        headers = {ROLLOUT_HEADER: uuid.uuid4().hex}
        for attempt in range(1 + self.retries):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            url = await self.resolve(name)
            try:
                response = await self.client.request("POST", f"{url}/run", json=row, deadline_s=remaining,
                                                     retries=1, headers=headers)
            except UpstreamError as exc:
                if exc.kind == FailureKind.TIMEOUT and time.monotonic() >= deadline:
                    raise UpstreamError(f"rollout deadline of {self.deadline_s:g}s exceeded on agent {name!r} "
                                        f"({exc})", kind=FailureKind.TIMEOUT) from None
                last = exc  # unreachable or 502/503/504: it may have moved; ask the head again
                self.directory.invalidate(name)
                await asyncio.sleep(min(0.2 * 2 ** attempt, max(0.0, deadline - time.monotonic())))
                continue
            if response.status_code == 500 and attempt < self.retries:
                # what Ray Serve answers for the requests of a replica that died: the retry, under the same
                # rollout id, goes on from the rollout's checkpoint on another replica (a real agent bug
                # answers 500 again and is masked then)
                last = UpstreamError(f"agent {name!r} answered 500: {_detail(response)}")
                await asyncio.sleep(min(0.2 * 2 ** attempt, max(0.0, deadline - time.monotonic())))
                continue
            if response.status_code >= 400:
                raise UpstreamError(f"agent {name!r} answered {response.status_code}: {_detail(response)}",
                                    kind=FailureKind.BAD_REQUEST if response.status_code < 500 else FailureKind.UPSTREAM)
            try:
                return response.json()
            except ValueError:
                raise UpstreamError(f"agent {name!r} answered with invalid JSON: {response.text[:200]}") from None
        if last is None or time.monotonic() >= deadline:
            raise UpstreamError(f"rollout deadline of {self.deadline_s:g}s exceeded on agent {name!r}"
                                + (f" ({last})" if last else ""), kind=FailureKind.TIMEOUT)
        raise UpstreamError(f"agent {name!r} failed after {1 + self.retries} attempts: {last}", kind=last.kind)

    @staticmethod
    def _finish(row: dict[str, Any], reply: Any) -> dict[str, Any]:
        if not isinstance(reply, dict):
            return failure_record(row, FailureKind.UPSTREAM, f"agent reply is not a JSON object: {str(reply)[:200]}")
        record = dict(reply)
        for key in ("_ng_task_index", "_ng_rollout_index", "agent_ref"):
            if key in row:
                record[key] = row[key]
        if record.get("mask_sample"):
            record.setdefault("failure_kind", str(FailureKind.UPSTREAM))
            record.setdefault("failure_reason", "the agent masked this rollout without a reason")
            record["reward"] = None
            return record
        reward = record.get("reward")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            return failure_record(row, FailureKind.UPSTREAM, f"agent reply has no numeric reward (got {reward!r})")
        if record.get("policy_version") is None:
            record["policy_version"] = policy_version(record.get("response"))
        return record




def _detail(response: Any) -> str:
    try:
        body = response.json()
        if isinstance(body, dict) and body.get("detail"):
            return str(body["detail"])[:500]
    except ValueError:
        pass
    return response.text[:500]


class LoopThread:
    """A private event loop in a daemon thread, so sync callers (a TRL rollout_func, verl's
    compute_score) can run async client code without owning a loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="gymserve-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


_loop: LoopThread | None = None
_loop_lock = threading.Lock()


def background_loop() -> LoopThread:
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = LoopThread()
        return _loop


def run_sync(factory: Callable[[], Awaitable[T]], timeout: float | None = None) -> T:
    """Run `factory()` on the shared background loop and wait for its result."""
    return background_loop().run(factory(), timeout)
