"""Sessions belong to whoever seeded them (real `resources/workplace` servers): the server issues the id, so a
caller can neither pick one nor reset, use or close another's; open sessions are capped (429) and idle ones
expire."""
from __future__ import annotations

import time
from typing import Iterator

import httpx
import pytest

from gymserve.testing import ServerProcess

ROW = {"responses_create_params": {"input": [{"role": "user", "content": "q"}]}, "ground_truth": []}


@pytest.fixture(scope="module")
def workplace() -> Iterator[ServerProcess]:
    with ServerProcess("resources/workplace", "max_sessions=3", "session_ttl_s=2", name="sessions-workplace") as proc:
        yield proc


def seed(server: ServerProcess, **headers: str) -> str:
    reply = server.post("/seed_session", json=ROW, headers=headers)
    assert reply.status_code == 200, reply.text
    sid = reply.json()["session_id"]
    assert reply.headers["x-session-id"] == sid
    return sid


def close(server: ServerProcess, sid: str) -> None:
    server.post("/close_session", json={}, headers={"X-Session-Id": sid})


def new_email(server: ServerProcess, sid: str) -> httpx.Response:
    return server.post("/send_email", json={"recipient": "bob.martinez@lumen.io", "subject": "mine", "body": "b"},
                       headers={"X-Session-Id": sid})


def outbox(server: ServerProcess, sid: str) -> int:
    reply = server.post("/search_emails", json={"query": "mine"}, headers={"X-Session-Id": sid})
    assert reply.status_code == 200, reply.text
    return len(reply.json()) if isinstance(reply.json(), list) else len(reply.json().get("emails", []))


def test_caller_cannot_pick_a_session_id(workplace):
    sid = seed(workplace, **{"X-Session-Id": "chosen-by-client"})
    try:
        assert sid != "chosen-by-client" and len(sid) >= 32
    finally:
        close(workplace, sid)


def test_another_caller_cannot_reset_or_take_over_a_session(workplace):
    victim = seed(workplace)
    try:
        assert new_email(workplace, victim).status_code == 200
        before = outbox(workplace, victim)
        # the attacker seeds "over" the victim's id (header and cookie): it gets a session of its own
        attacker = seed(workplace, **{"X-Session-Id": victim, "Cookie": f"gymserve_session={victim}"})
        try:
            assert attacker != victim
            assert outbox(workplace, victim) == before  # the victim's state was not reset
            assert before >= 1 and outbox(workplace, attacker) == 0  # a fresh database of its own
        finally:
            close(workplace, attacker)
        # nor can an id be guessed: a near miss is an unknown session
        assert new_email(workplace, victim[:-1] + ("A" if victim[-1] != "A" else "B")).status_code == 409
    finally:
        close(workplace, victim)


def test_session_cap_is_429(workplace):
    sids = [seed(workplace) for _ in range(3)]
    try:
        reply = workplace.post("/seed_session", json=ROW)
        assert reply.status_code == 429, reply.text
        assert "max_sessions=3" in reply.json()["detail"]
        close(workplace, sids.pop())
        sids.append(seed(workplace))  # a closed session frees its slot
    finally:
        for sid in sids:
            close(workplace, sid)


@pytest.mark.timeout(60)
def test_idle_sessions_expire(workplace):
    sids = [seed(workplace) for _ in range(3)]
    time.sleep(3)  # past session_ttl_s=2 without a call
    reply = new_email(workplace, sids[0])
    assert reply.status_code == 409 and "expired" in reply.json()["detail"]
    fresh = [seed(workplace) for _ in range(3)]  # the expired ones no longer count against the cap
    for sid in fresh:
        close(workplace, sid)


def test_named_session_belongs_to_its_seeder(workplace):
    """NeMo-Gym's caller-named sessions: the name alone does not let another caller in."""
    body = {"resources_session_id": "rs-owner", "episode_id": {"id": "e"}, "task_id": {"id": "t"}, "task_data": ROW}
    with httpx.Client(base_url=workplace.url, timeout=30) as owner, \
            httpx.Client(base_url=workplace.url, timeout=30) as other:
        first = owner.post("/seed_session", json=body)
        assert first.status_code == 200 and first.json() == {"resources_session_id": "rs-owner"}
        sid = first.headers["x-session-id"]
        assert other.post("/seed_session", json=body).status_code == 409  # no cookie: not the owner
        assert other.post("/close_session", json={"resources_session_id": "rs-owner",
                                                  "episode_id": {"id": "e"}}).status_code == 409
        assert owner.post("/seed_session", json=body).headers["x-session-id"] == sid  # idempotent for its owner
        assert owner.post("/close_session", json={"resources_session_id": "rs-owner",
                                                  "episode_id": {"id": "e"}}).status_code == 200
