"""The Docker Engine API exec stream's demultiplexing (8-byte frame headers) and its output cap, on
crafted streams; the same with the real engine is in tests/deploy/test_docker_engine_api.py."""
from __future__ import annotations

import asyncio

import pytest

from services.core.sandbox.engine_api import EngineAPI, demux, socket_path
from services.core.sandbox.workspace import WorkspaceError


def frame(kind: int, data: bytes) -> bytes:
    return bytes([kind, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


def reader(data: bytes) -> asyncio.StreamReader:
    stream = asyncio.StreamReader()
    stream.feed_data(data)
    stream.feed_eof()
    return stream


async def test_frames_go_to_their_stream_in_order() -> None:
    out, err = bytearray(), bytearray()
    data = frame(1, b"a" * 70000) + frame(2, b"oops\n") + frame(1, b"b") + frame(2, b"") + frame(1, b"c\n")
    assert await demux(reader(data), out, err, 1 << 20) is False
    assert out == b"a" * 70000 + b"bc\n" and err == b"oops\n"


async def test_output_is_cut_at_the_cap_per_stream() -> None:
    out, err = bytearray(), bytearray()
    assert await demux(reader(frame(2, b"e" * 10) + frame(1, b"x" * 600) + frame(1, b"y" * 600)), out, err, 1000) is True
    assert out == b"x" * 600 + b"y" * 400 and err == b"e" * 10
    exact, err = bytearray(), bytearray()  # exactly the cap is not over it
    assert await demux(reader(frame(1, b"z" * 1000)), exact, err, 1000) is False and len(exact) == 1000


@pytest.mark.parametrize("data", [frame(1, b"abc")[:5], frame(1, b"abcdef")[:10]])
async def test_a_stream_cut_inside_a_frame_is_an_engine_error(data: bytes) -> None:
    with pytest.raises(WorkspaceError, match="docker exec failed"):
        await demux(reader(data), bytearray(), bytearray(), 1000)


async def test_an_unreachable_socket_is_a_workspace_error(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    assert socket_path() == f"{tmp_path}/no.sock"
    with pytest.raises(WorkspaceError, match="unreachable"):
        await EngineAPI.connect()
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    assert socket_path() is None
    with pytest.raises(WorkspaceError, match="not a unix socket"):
        await EngineAPI.connect()
