"""The docker provider's commands through the Engine API on its unix socket, with the real engine
(installed and started when missing, as in test_docker_sandbox.py): stdout and stderr are
demultiplexed, a command printing 10 MB is cut at the output cap and reported exactly as through the
`docker exec` CLI (which commands with stdin, and every command without a reachable socket, use)."""
from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

from services.core.sandbox import engine_api
from services.core.sandbox.docker import DockerProvider
from services.core.sandbox.workspace import Limits, Workspace, WorkspaceError
from tests.docker_engine import containers, engine_and_image

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]
LIMITS = Limits(wall_s=30, cpu_s=20, memory_mb=256, pids=64, disk_mb=48, file_mb=32, output_bytes=16384)
TEN_MB = "head -c 10000000 /dev/zero | tr '\\0' x"


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    yield from engine_and_image()


@pytest.fixture
async def provider(image: str) -> AsyncIterator[DockerProvider]:
    p = DockerProvider(default_image=image)
    await p.start()
    before = set(containers())
    yield p
    await p.close()
    assert set(containers()) <= before, "workspace containers left behind"


@pytest.fixture
async def workspace(provider: DockerProvider) -> AsyncIterator[Workspace]:
    ws = await provider.create(image=None, folder=None, limits=LIMITS)
    yield ws
    await ws.destroy()


async def through_cli(provider: DockerProvider, ws: Workspace, command: str, **kw: float) -> object:
    api, provider.api = provider.api, None
    try:
        return await ws.exec(command, **kw)
    finally:
        provider.api = api


async def test_streams_and_exit_codes(provider: DockerProvider, workspace: Workspace) -> None:
    assert provider.api is not None, "the engine's socket is reachable here: commands must not use the CLI"
    result = await workspace.exec("for i in 1 2 3; do echo out$i; echo err$i >&2; done; exit 3")
    assert (result.stdout, result.stderr, result.exit_code) == ("out1\nout2\nout3\n", "err1\nerr2\nerr3\n", 3)
    assert result == await through_cli(provider, workspace, "for i in 1 2 3; do echo out$i; echo err$i >&2; done; exit 3")
    written = await workspace.write_file("sub/f.txt", "from stdin\n")  # stdin: the CLI path
    assert written.exit_code == 0 and (await workspace.read_file("sub/f.txt")).stdout == "from stdin\n"


async def test_ten_megabytes_are_cut_at_the_cap_as_through_the_cli(provider: DockerProvider,
                                                                   workspace: Workspace) -> None:
    loud = await workspace.exec(TEN_MB)
    assert loud.output_exceeded and loud.exit_code is None and not loud.timed_out
    assert loud.stdout == "x" * LIMITS.output_bytes
    assert loud == await through_cli(provider, workspace, TEN_MB)
    noisy = await workspace.exec(f"echo fine; {TEN_MB} >&2")
    assert noisy.output_exceeded and noisy.stdout == "fine\n" and noisy.stderr == "x" * LIMITS.output_bytes
    after = await workspace.exec("echo still here")  # the cut stream left the workspace usable
    assert (after.stdout, after.exit_code) == ("still here\n", 0)


async def test_wall_clock_limit_and_engine_errors(provider: DockerProvider) -> None:
    ws = await provider.create(image=None, folder=None, limits=LIMITS)
    slow = await ws.exec("echo started; sleep 60", timeout_s=2)
    assert slow.timed_out and slow.exit_code is None and slow.stdout == "started\n" and "wall-clock" not in slow.stderr
    await ws.destroy()
    with pytest.raises(WorkspaceError, match="docker exec failed"):
        await ws.exec("true")


async def test_an_unreachable_socket_falls_back_to_the_cli(image: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_api, "socket_path", lambda: str(tmp_path / "no.sock"))
    p = DockerProvider(default_image=image)
    await p.start()
    assert p.api is None
    ws = await p.create(image=None, folder=None, limits=LIMITS)
    try:
        result = await ws.exec("echo via the cli; exit 4")
        assert (result.stdout, result.exit_code) == ("via the cli\n", 4)
    finally:
        await ws.destroy()
