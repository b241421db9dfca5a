"""services/core/client.py against a scripted real server (`models/stub`, scripted per session)."""
from __future__ import annotations

import json

import pytest

from gymserve.testing import ServerProcess
from services.core.errors import UpstreamError
from services.core.client import ServiceClient
from services.core.ports import free_port


@pytest.fixture(scope="module")
def stub():
    with ServerProcess("models/stub") as proc:
        yield proc


def body(script: list[dict]) -> dict:
    return {"input": "q", "metadata": {"stub_script": json.dumps(script)}}


async def test_retries_503_then_succeeds_with_session_header(stub):
    client = ServiceClient(backoff_s=0.01)
    try:
        reply = await client.request("POST", f"{stub.url}/v1/responses", json=body([{"status": 503}, {"text": "ok"}]),
                                     session_id="s-retry")
        assert reply.status_code == 200
        assert reply.json()["output"][0]["content"][0]["text"] == "ok"  # the second scripted step: header kept
    finally:
        await client.aclose()


async def test_4xx_is_returned_not_retried(stub):
    client = ServiceClient(backoff_s=0.01)
    try:
        reply = await client.request("POST", f"{stub.url}/v1/responses",
                                     json=body([{"status": 422, "error": "nope"}, {"text": "never"}]),
                                     session_id="s-4xx")
        assert reply.status_code == 422 and reply.json()["detail"] == "nope"
        again = await client.request("POST", f"{stub.url}/v1/responses", json=body([{"status": 422}, {"text": "2nd"}]),
                                     session_id="s-4xx")
        assert again.json()["output"][0]["content"][0]["text"] == "2nd"  # exactly one call was made before
    finally:
        await client.aclose()


async def test_503_until_the_end_is_an_upstream_error(stub):
    client = ServiceClient(backoff_s=0.01, retries=2)
    try:
        with pytest.raises(UpstreamError) as info:
            await client.request("POST", f"{stub.url}/v1/responses", json=body([{"status": 503}] * 5),
                                 session_id="s-503")
        assert info.value.kind == "upstream" and info.value.upstream_status == 503
    finally:
        await client.aclose()


@pytest.mark.timeout(30)
async def test_refused_connection_and_deadline(stub):
    client = ServiceClient(backoff_s=0.01, retries=1)
    try:
        with pytest.raises(UpstreamError) as refused:
            await client.request("POST", f"http://127.0.0.1:{free_port()}/x", json={}, deadline_s=5)
        assert refused.value.kind == "upstream"
        with pytest.raises(UpstreamError) as slow:
            await client.request("POST", f"{stub.url}/v1/responses", json=body([{"sleep": 10}]),
                                 session_id="s-slow", deadline_s=0.5)
        assert slow.value.kind == "timeout" and "the 0.5s deadline" in slow.value.message
    finally:
        await client.aclose()
