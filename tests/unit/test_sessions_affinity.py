"""Session affinity and rebuilding across replicas: real workplace servers on 127.0.0.1 (each app served
by uvicorn in a thread of this process) sharing one journal folder, as replicas of one server do.

A replica that stops answering is one whose server was stopped; the Ray test SIGKILLs real replicas.
"""
from __future__ import annotations

import contextlib
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from gymserve.testing import served_in_thread
from services.core.affinity import CALL_SEQ_HEADER, REPLICA_HEADER
from services.core.ports import free_port
from services.core.resource import Environment, ResourceConfig, Session, create_resource_app, tool
from services.resources.workplace.app import Config as WorkplaceConfig
from services.resources.workplace.app import Workplace
from services.resources.workplace.dataset import build_rows

KEY = "affinity-test-key"
ROW = next(r for r in build_rows() if r["ground_truth"][0]["name"] == "send_email")
EMAIL = {"recipient": "bob.martinez@lumen.io", "subject": "Launch", "body": "It moves."}


class Jittery(Workplace):
    """A workplace whose replies carry a number private to the process: made non-deterministic on
    purpose, so a replay on another replica answers differently."""

    nonce = secrets.token_hex(4)

    def call_tool(self, session: Session, name: str, arguments: dict[str, Any]) -> Any:
        reply = super().call_tool(session, name, arguments)
        return {"reply": reply, "nonce": self.nonce} if name == "send_email" else reply


class Counter(Environment):
    """A stateful environment that does not declare itself rebuildable."""

    async def seed(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        session.data["n"] = 0
        return {}

    @tool
    async def bump(self, session: Session) -> int:
        session.data["n"] += 1
        return session.data["n"]


@contextlib.contextmanager
def replica(env_cls: type[Environment], store: Path, config_cls: type[ResourceConfig] = WorkplaceConfig,
            **options: Any) -> Iterator[str]:
    port = free_port()
    env = env_cls(config_cls(name="wp", port=port, session_store=str(store), use_pool=False, **options))
    with served_in_thread(create_resource_app(env), port=port):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    """Every replica requires the key, so a call one replica passes to another must carry it."""
    monkeypatch.setenv("GYMSERVE_API_KEY", KEY)


def post(url: str, path: str, body: Any = None, sid: str | None = None, **headers: str) -> httpx.Response:
    headers["Authorization"] = f"Bearer {KEY}"
    if sid:
        headers["X-Session-Id"] = sid
    return httpx.post(url + path, json=body, headers=headers, timeout=30)


def journals(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir() if p.is_file())


def test_calls_reach_the_owner_and_a_session_is_rebuilt_once_its_replica_is_gone(tmp_path):
    with replica(Workplace, tmp_path) as b_url:
        with replica(Workplace, tmp_path) as a_url:
            seeded = post(a_url, "/seed_session", ROW)
            sid = seeded.json()["session_id"]
            assert seeded.headers[REPLICA_HEADER] == a_url and "." in sid
            assert journals(tmp_path) == [f"{sid}.jsonl"]
            # a call that lands on the other replica is answered by the owner
            sent = post(b_url, "/send_email", EMAIL, sid, **{CALL_SEQ_HEADER: "1"})
            assert sent.status_code == 200 and sent.headers[REPLICA_HEADER] == a_url, sent.text
            bad = post(b_url, "/update_task", {"task_id": "T404", "status": "Completed"}, sid,
                       **{CALL_SEQ_HEADER: "2"})
            assert bad.status_code == 400 and "T404" in bad.json()["detail"]
        # the owner is gone: the next call rebuilds the session on b by replaying both calls
        again = post(b_url, "/send_email", EMAIL, sid, **{CALL_SEQ_HEADER: "1"})
        assert again.status_code == 200 and again.headers[REPLICA_HEADER] == b_url, again.text
        assert again.json() == sent.json()  # a repeated call is answered from the journal, not applied twice
        emails = post(b_url, "/search_emails", {"query": "Launch"}, sid, **{CALL_SEQ_HEADER: "3"}).json()
        assert len([e for e in emails if e["subject"] == "Launch"]) == 1
        done = post(b_url, "/verify", {**ROW, "response": {"output": []}}, sid, **{"X-Close-Session": "1"})
        assert done.status_code == 200 and done.json()["state_source"] == "session"
        assert journals(tmp_path) == [], "a closed session leaves no journal"


def test_a_replay_that_diverges_is_refused_with_its_failure_kind(tmp_path):
    with replica(Jittery, tmp_path) as b_url:
        Jittery.nonce = "first"
        with replica(Jittery, tmp_path) as a_url:
            sid = post(a_url, "/seed_session", ROW).json()["session_id"]
            assert post(a_url, "/send_email", EMAIL, sid, **{CALL_SEQ_HEADER: "1"}).json()["nonce"] == "first"
        Jittery.nonce = "second"
        lost = post(b_url, "/search_emails", {"query": "Launch"}, sid, **{CALL_SEQ_HEADER: "2"})
        assert lost.status_code == 409 and lost.json()["error"]["failure_kind"] == "session_diverged", lost.text
        verify = post(b_url, "/verify", {**ROW, "response": {"output": []}}, sid)
        assert verify.status_code == 409 and verify.json()["error"]["failure_kind"] == "session_diverged"
        assert post(b_url, "/close_session", None, sid).status_code == 200
    assert journals(tmp_path) == []


def test_an_environment_that_cannot_be_rebuilt_says_so(tmp_path):
    with replica(Counter, tmp_path, ResourceConfig) as b_url:
        with replica(Counter, tmp_path, ResourceConfig) as a_url:
            sid = post(a_url, "/seed_session", {}).json()["session_id"]
            assert post(b_url, "/bump", {}, sid).json() == 1  # forwarded to the owner
            assert journals(tmp_path) == [], "nothing is journaled for an environment that cannot replay it"
        lost = post(b_url, "/bump", {}, sid)
        assert lost.status_code == 409 and lost.json()["error"]["failure_kind"] == "session_lost"
        assert "cannot rebuild" in lost.json()["detail"]


def test_new_sessions_go_to_the_less_loaded_replica(tmp_path):
    with replica(Workplace, tmp_path) as a_url, replica(Workplace, tmp_path) as b_url:
        owners = [post(a_url, "/seed_session", ROW).headers[REPLICA_HEADER] for _ in range(12)]
        # a seeds while it holds no more than a few more than b; then b gets the new sessions
        assert owners.count(b_url) >= 3 and owners.count(a_url) >= 3, owners


def test_max_sessions_is_per_replica_and_a_full_one_seeds_on_a_peer(tmp_path):
    with replica(Workplace, tmp_path, max_sessions=2) as a_url, replica(Workplace, tmp_path, max_sessions=2) as b_url:
        seeded = [post(a_url, "/seed_session", ROW) for _ in range(4)]
        assert [r.status_code for r in seeded] == [200] * 4
        assert sorted(r.headers[REPLICA_HEADER] for r in seeded) == sorted([a_url, a_url, b_url, b_url])
        full = post(a_url, "/seed_session", ROW)
        assert full.status_code == 429 and "max_sessions" in full.json()["detail"]


def test_a_stopping_replica_serves_its_open_sessions_until_they_close(tmp_path):
    """Scale-down: a replica with sessions that cannot move keeps answering them on its own address
    (the balanced one is gone), takes no new ones, and stops once they are closed."""
    port = free_port()
    env = Counter(ResourceConfig(name="wp", port=port, session_store=str(tmp_path), use_pool=False,
                                 direct_host="127.0.0.1", drain_s=60))
    stopped = threading.Event()
    with contextlib.ExitStack() as stack:
        stack.enter_context(served_in_thread(create_resource_app(env), port=port))
        seeded = post(f"http://127.0.0.1:{port}", "/seed_session", {})
        sid, own = seeded.json()["session_id"], seeded.headers[REPLICA_HEADER]
        assert own != f"http://127.0.0.1:{port}"  # the replica's own port, next to the balanced one

        def stop() -> None:
            stack.close()
            stopped.set()

        stopper = threading.Thread(target=stop)
        stopper.start()
        _wait_for(lambda: env.affinity.draining)
        assert post(own, "/bump", {}, sid).json() == 1, "an open session is still served while draining"
        assert post(own, "/seed_session", {}).status_code == 503, "no new sessions while draining"
        assert not stopped.is_set()
        assert post(own, "/close_session", None, sid).json()["closed"] is True
        stopper.join(30)
        assert stopped.is_set(), "the replica stops once its last session is closed"


def _wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_nemo_gym_named_session_follows_its_cookie_and_is_rebuilt_under_its_name(tmp_path):
    named = {"resources_session_id": "rollout-7", "task_data": ROW}
    with replica(Workplace, tmp_path) as b_url:
        with replica(Workplace, tmp_path) as a_url:
            seeded = post(a_url, "/seed_session", named)
            sid = seeded.headers["X-Session-Id"]
            cookie = {"Cookie": f"gymserve_session={sid}"}
            again = post(b_url, "/seed_session", named, **cookie)  # a repeated seed reaches the owner
            assert again.status_code == 200 and again.headers[REPLICA_HEADER] == a_url, again.text
            assert post(b_url, "/send_email", EMAIL, **cookie, **{CALL_SEQ_HEADER: "1"}).status_code == 200
        # the owner is gone: rebuilt on b under the same name, which the caller then closes by name
        emails = post(b_url, "/search_emails", {"query": "Launch"}, **cookie, **{CALL_SEQ_HEADER: "2"})
        assert emails.status_code == 200 and emails.headers[REPLICA_HEADER] == b_url, emails.text
        closed = post(b_url, "/close_session", {"resources_session_id": "rollout-7"}, **cookie)
        assert closed.status_code == 200, closed.text
        assert journals(tmp_path) == []
        refused = post(b_url, "/seed_session", named, **cookie)
        assert refused.status_code == 409 and "closed" in refused.json()["detail"]
