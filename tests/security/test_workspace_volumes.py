"""A row image with a `VOLUME` gets no disk beyond `disk_mb` (docker provider, the real engine; slow).

Docker makes each `VOLUME` of an image an anonymous volume on the host's disk, which no limit of the
container covers: a command could fill the host's disk through it. The provider mounts an empty
size-capped tmpfs on each one instead, sharing `disk_mb` with the workspace."""
from __future__ import annotations

import subprocess
import uuid
from typing import AsyncIterator, Iterator

import pytest

from services.core.sandbox.docker import DockerProvider, disk_shares
from services.core.sandbox.workspace import Limits, Workspace
from tests.docker_engine import containers, engine_and_image

LIMITS = Limits(wall_s=60, cpu_s=30, memory_mb=512, pids=64, disk_mb=32, file_mb=256, output_bytes=16384)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def volume_image() -> Iterator[str]:
    """The workspace image plus two `VOLUME`s the sandbox user may write, one holding a file of the image's
    (which, as an anonymous volume, would be copied to the host's disk)."""
    engine = engine_and_image()
    base = next(engine)
    tag = f"gymserve-volume-test:{uuid.uuid4().hex[:8]}"
    dockerfile = (f"FROM {base}\nUSER root\nRUN mkdir -p /data /cache && echo kept > /data/seed "
                  "&& chown -R 65534:65534 /data /cache\nVOLUME /data /cache\n")
    built = subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=dockerfile, text=True,
                           capture_output=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    try:
        yield tag
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)
        next(engine, None)  # stops an engine the fixture started


@pytest.fixture
async def workspace(volume_image: str) -> AsyncIterator[Workspace]:
    provider = DockerProvider(default_image=volume_image)
    await provider.start()
    before = set(containers())
    volumes_before = _anonymous_volumes()
    ws = await provider.create(image=None, folder=None, limits=LIMITS)
    try:
        yield ws
    finally:
        await ws.destroy()
        await provider.close()
        assert set(containers()) <= before, "workspace containers left behind"
        assert _anonymous_volumes() <= volumes_before, "volumes left behind"


def _anonymous_volumes() -> set[str]:
    out = subprocess.run(["docker", "volume", "ls", "-q"], capture_output=True, text=True, timeout=60)
    return set(out.stdout.split())


@pytest.mark.timeout(3600)  # the first run builds the engine and the workspace image
async def test_an_image_volume_holds_no_more_than_its_share_of_disk_mb(workspace: Workspace) -> None:
    workspace_mb, volume_mb = disk_shares(LIMITS.disk_mb, 2)
    assert workspace_mb + 2 * volume_mb <= LIMITS.disk_mb
    mounts = await workspace.exec("cat /proc/mounts")
    assert all(f" {path} tmpfs " in mounts.stdout for path in ("/data", "/cache")), mounts.stdout
    written = {}
    for where in ("/data", "/cache", "/workspace"):
        await workspace.exec(f"head -c {4 * LIMITS.disk_mb}M /dev/zero > {where}/fill 2>/dev/null")
        size = await workspace.exec(f"du -sm {where}/fill | cut -f1")
        written[where] = int(size.stdout.strip() or 0)
    assert written["/data"] <= volume_mb + 1 and written["/cache"] <= volume_mb + 1, written
    assert sum(written.values()) <= LIMITS.disk_mb + 2, written
