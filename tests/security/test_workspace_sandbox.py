"""The adversarial suite against both workspace providers (bwrap always; docker with the real engine,
slow): breakout probes (root, capabilities, no_new_privs, nested namespaces, host devices and files,
writable root), network, leaked environment, fork/memory/disk bombs, and nothing left after destroy.
The same probe is shown to FAIL on deliberately weakened configurations (bwrap sharing the host's
network, a `--privileged` container), so a regression in the isolation cannot pass unnoticed."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import pytest

from services.core.sandbox.folder import BwrapProvider
from services.core.sandbox.docker import DockerProvider, DockerWorkspace, run_args
from services.core.sandbox.workspace import Limits, Provider, Workspace
from tests.docker_engine import containers, engine_and_image
from tests.integration.sandbox_helpers import sandbox_dir

SECRET = "GYMSERVE_TEST_SECRET_9d1e"
LIMITS = Limits(wall_s=15, cpu_s=10, memory_mb=256, pids=64, disk_mb=48, file_mb=32, output_bytes=16384)
HOST_FILE = str(Path(__file__).resolve())


def probe_script(port: int) -> str:
    """Prints one FINDING line per isolation property that does not hold."""
    return "\n".join([
        '[ "$(id -u)" != 0 ] || echo "FINDING root"',
        "grep -q '^CapEff:\\s*0*$' /proc/self/status || echo 'FINDING effective capabilities'",
        "grep -q '^CapBnd:\\s*0*$' /proc/self/status || echo 'FINDING capability bounding set not empty'",
        "grep -q '^NoNewPrivs:\\s*1' /proc/self/status || echo 'FINDING no_new_privs off'",
        "unshare -U true 2>/dev/null && echo 'FINDING nested user namespace'",
        "unshare -m true 2>/dev/null && echo 'FINDING mount namespace'",
        f"timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>/dev/null && echo 'FINDING host loopback reachable'",
        "timeout 3 bash -c 'exec 3<>/dev/tcp/192.0.2.1/80' 2>/dev/null && echo 'FINDING network'",
        f"[ -e {HOST_FILE} ] && echo 'FINDING host files visible'",
        "cat /etc/shadow >/dev/null 2>&1 && echo 'FINDING /etc/shadow readable'",
        "touch /usr/.gymserve-probe 2>/dev/null && echo 'FINDING writable root'",
        "ls /dev | grep -qE '^(sd|nvme|vd|xvd|loop|mem$|kmsg$)' && echo 'FINDING host devices'",
        f"env | grep -q {SECRET} && echo 'FINDING environment leaked'",
        "echo probe-done",
    ])


@pytest.fixture(scope="module")
def listener() -> Iterator[int]:
    """A socket listening on the host's loopback: a sandbox must not reach it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def docker_image() -> Iterator[str]:
    yield from engine_and_image()


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.slow)])
async def provider(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Provider]:
    monkeypatch.setenv(SECRET, "1")
    if request.param == "bwrap":
        with sandbox_dir() as where:
            p: Provider = BwrapProvider(root=where)
            await p.start()
            yield p
            assert not list(where.iterdir()), "workspace folders left behind"
    else:
        p = DockerProvider(default_image=request.getfixturevalue("docker_image"))
        await p.start()
        before = set(containers())
        try:
            yield p
        finally:
            await p.close()
        assert set(containers()) <= before, "workspace containers left behind"


async def findings(ws: Workspace, port: int) -> list[str]:
    result = await ws.exec(probe_script(port))
    assert "probe-done" in result.stdout, result
    return [line for line in result.stdout.splitlines() if line.startswith("FINDING")]


@pytest.fixture
async def workspace(provider: Provider) -> AsyncIterator[Workspace]:
    ws = await provider.create(image=None, folder=None, limits=LIMITS)
    yield ws
    await ws.destroy()


async def test_breakout_probes_find_nothing(workspace: Workspace, listener: int) -> None:
    assert await findings(workspace, listener) == []


async def test_fork_bomb_is_contained(workspace: Workspace) -> None:
    result = await workspace.exec(":(){ :|:& };: 2>/dev/null; sleep 1; echo survived", timeout_s=10)
    assert result.timed_out or "survived" in result.stdout
    assert (await workspace.exec("echo alive")).stdout == "alive\n"  # the workspace still works afterwards


async def test_memory_bomb_fails(workspace: Workspace) -> None:
    result = await workspace.exec("python3 -c 'x = bytearray(2 << 30); print(\"allocated\")'")
    assert result.exit_code != 0 and "allocated" not in result.stdout


async def test_disk_bomb_is_bounded(provider: Provider, workspace: Workspace) -> None:
    bomb = await workspace.exec("dd if=/dev/zero of=big bs=1M count=400 2>/dev/null; for i in 1 2 3; do "
                                "dd if=/dev/zero of=more$i bs=1M count=30 2>/dev/null; done")
    size = int((await workspace.exec("du -sm big")).stdout.split()[0])
    assert size <= LIMITS.file_mb, "one file grew past file_mb"
    total = int((await workspace.exec("du -sm .")).stdout.split()[0])
    if provider.name == "docker":  # a size-capped tmpfs: a hard limit
        assert total <= LIMITS.disk_mb + 1
    else:  # a host folder: files are capped one by one, the total is checked after each command
        assert total <= LIMITS.disk_mb or ("over its 48 MB limit" in bomb.stderr and bomb.exit_code != 0), bomb


async def test_output_and_time_are_bounded(workspace: Workspace) -> None:
    loud = await workspace.exec("yes")
    assert loud.output_exceeded and loud.exit_code is None and len(loud.stdout) <= LIMITS.output_bytes
    slow = await workspace.exec("sleep 60", timeout_s=2)
    assert slow.timed_out and slow.exit_code is None


async def test_destroy_removes_everything(provider: Provider) -> None:
    ws = await provider.create(image=None, folder=Path(__file__).parent, limits=LIMITS)
    assert "test_workspace_sandbox.py" in (await ws.exec("ls")).stdout
    await ws.destroy()
    await ws.destroy()  # idempotent


async def test_probe_detects_a_bwrap_sharing_the_host_network(listener: int) -> None:
    with sandbox_dir() as where:
        weak = BwrapProvider(root=where)
        await weak.start()
        weak.seccomp_filter = None  # the filter alone refuses AF_INET sockets: weaken both layers
        strong_args = weak.bwrap_args

        def weakened(tree: Path, limits: Limits, seccomp_fd: int | None = None) -> list[str]:
            args = strong_args(tree, limits, seccomp_fd)
            return [*args[:2], "--share-net", *args[2:]]  # right after --unshare-all

        weak.bwrap_args = weakened  # type: ignore[method-assign]
        ws = await weak.create(image=None, folder=None, limits=LIMITS)
        try:
            assert "FINDING host loopback reachable" in await findings(ws, listener)
        finally:
            await ws.destroy()


@pytest.mark.slow
async def test_probe_detects_a_privileged_container(docker_image: str, listener: int) -> None:
    p = DockerProvider(default_image=docker_image)
    await p.start()
    name = "gymserve-ws-weakened-probe"
    args: list[Any] = run_args(name, docker_image, LIMITS, extra=["--privileged"])
    assert (await p.cli(*args)).exit_code == 0
    try:
        found = await findings(DockerWorkspace(p, name, LIMITS), listener)
        assert "FINDING capability bounding set not empty" in found, found
    finally:
        await p.remove([name])
        await p.close()
