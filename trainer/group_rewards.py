"""Group rewards: an environment whose reward is defined over a GRPO group (its resource server
answers `GET /reward_scope` with `group`, e.g. genrm_compare's pairwise judge) scores each
finished group in one `POST /verify/batch`.

An agent verifies each rollout alone; for such an environment the trainer client then posts the
group's completed rollouts (the agent's verify bodies, with a shared `group_id`) to the resource
server named in the agent's `/ready` (`resources_server`), found through the head, and the group
reply replaces each rollout's reward, reward components and verify fields: the single `/verify`
verdict is kept nowhere. A masked item masks its sample; a batch call that fails masks the whole
group (`upstream`), since its rewards are relative to each other. Rollouts that failed already
stay failed and are left out of the group; a group left with one rollout keeps the agent's verdict
(a batch of one is judged as a single `/verify` is).
"""
from __future__ import annotations

import logging
import time
from typing import Any

from services.core.client import ServiceClient
from services.core.directory import Directory
from services.core.errors import UpstreamError
from services.core.schemas import RolloutReply, VerifyReply

log = logging.getLogger("gymserve.trainer.groups")

# What the agent adds to the verify reply (num_turns, session_id, stop_reason) and the client's
# `policy_version`: kept from the rollout; everything else comes from the group reply.
AGENT_FIELDS = tuple(sorted(set(RolloutReply.model_fields) - set(VerifyReply.model_fields))) + ("policy_version",)
GROUP_SCOPE = "group"


def group_id_of(row: dict[str, Any], agent: str) -> Any:
    """The row's own `group_id`, else one naming the task (all rollouts of a group share the row)."""
    given = row.get("group_id")
    return given if isinstance(given, (str, int)) and not isinstance(given, bool) else \
        f"{agent}:{row.get('_ng_task_index')}"


class GroupRewards:
    """Finds which agents' environments score groups, and re-scores finished groups there."""

    def __init__(self, directory: Directory, client: ServiceClient, *, deadline_s: float, retries: int) -> None:
        self.directory = directory
        self.client = client
        self.deadline_s = deadline_s
        self.retries = retries
        self._scopes: dict[str, str | None] = {}  # agent -> its resource server when that scores groups

    async def group_server(self, agent: str) -> str | None:
        """The resource server of `agent` when its reward is defined over a group, else None.

        Found through the head (a client given fixed agent URLs and no head scores items). A
        definite answer is kept for the client's life; a lookup that fails is asked again next time."""
        if agent in self._scopes:
            return self._scopes[agent]
        if not self.directory.head_url:
            return None
        try:
            self._scopes[agent] = await self._lookup(agent)
        except (UpstreamError, ValueError) as exc:
            log.warning("cannot tell whether agent %r's environment scores groups (%s); this group keeps the "
                        "agent's rewards", agent, exc)
            return None
        return self._scopes[agent]

    async def _lookup(self, agent: str) -> str | None:
        ready = await self.client.request("GET", f"{await self.directory.url(agent)}/ready", deadline_s=10.0)
        if ready.status_code == 404:  # not a gymserve agent: it does not say
            return None
        if ready.status_code != 200:
            raise UpstreamError(f"agent /ready answered {ready.status_code}")
        body = ready.json()
        resource = body.get("resources_server") if isinstance(body, dict) else None
        if not isinstance(resource, str) or not resource:
            return None  # an agent given a URL, not an instance the head knows
        reply = await self.client.request("GET", f"{await self.directory.url(resource)}/reward_scope", deadline_s=10.0)
        if reply.status_code == 404:  # no such endpoint (NeMo-Gym's servers, an older gymserve): items
            return None
        if reply.status_code != 200:
            raise UpstreamError(f"{resource} /reward_scope answered {reply.status_code}")
        return resource if reply.json() == GROUP_SCOPE else None

    async def rescore(self, agent: str, resource: str, rows: list[dict[str, Any]], records: list[dict[str, Any]],
                      deadline_at: float | None) -> list[dict[str, Any] | str]:
        """The group reply for each (row, record) pair, or one reason string per item when the batch
        call failed (the caller masks them)."""
        bodies = [{**row, "response": record.get("response"), "group_id": group_id_of(row, agent)}
                  for row, record in zip(rows, records)]
        budget = self.deadline_s if deadline_at is None else min(self.deadline_s, deadline_at - time.monotonic())
        if budget <= 0:
            return ["no time left for the group's /verify/batch"] * len(rows)
        try:
            url = await self.directory.url(resource)
            response = await self.client.request("POST", f"{url}/verify/batch", json=bodies, deadline_s=budget,
                                                 retries=self.retries)
            if response.status_code >= 400:
                raise UpstreamError(f"answered {response.status_code}: {response.text[:300]}")
            replies = response.json()
            if not isinstance(replies, list) or len(replies) != len(bodies) or \
                    not all(isinstance(r, dict) for r in replies):
                raise UpstreamError(f"answered {len(replies) if isinstance(replies, list) else type(replies).__name__}"
                                    f" items for a group of {len(bodies)}")
        except (UpstreamError, ValueError) as exc:
            reason = f"group /verify/batch on resource server {resource!r} failed: {exc}"
            return [reason] * len(rows)
        return [{**reply, **{k: record[k] for k in AGENT_FIELDS if k in record}}
                for reply, record in zip(replies, records)]

