"""How servers are served (services/core/serving.py): a reply's status line and headers leave in the same
write as its body (one segment, one read for the client), a streamed reply's headers are not held back
past the loop's turn, `tune_gc` freezes the start-up heap; the protocol touches uvicorn only through
public names, and nothing outside tests and benchmarks writes HTTP on httptools itself."""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from services.core.serving import GC_GEN0_THRESHOLD, CoalescingTransport, HeaderDeadlineProtocol

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


async def test_headers_and_body_leave_in_one_write() -> None:
    transport = Recorder()
    wrapped = CoalescingTransport(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    wrapped.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert transport.writes == []
    wrapped.write(b"{}")
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    await asyncio.sleep(0)  # the scheduled flush finds nothing held
    assert len(transport.writes) == 1
    assert wrapped.is_closing() is False  # everything else is the transport's


async def test_streamed_headers_are_flushed_at_the_end_of_the_loops_turn() -> None:
    transport = Recorder()
    wrapped = CoalescingTransport(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    wrapped.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    await asyncio.sleep(0)
    assert transport.writes == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
    wrapped.write(b"5\r\nfirst\r\n")
    assert transport.writes[-1] == b"5\r\nfirst\r\n"


async def test_close_sends_what_is_held_first() -> None:
    transport = Recorder()
    wrapped = CoalescingTransport(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
    wrapped.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    wrapped.close()
    assert transport.writes == [b"HTTP/1.1 204 No Content\r\n\r\n"] and transport.closed


def test_tune_gc_freezes_the_start_up_heap() -> None:
    """In a fresh interpreter (it changes the process's collector for good)."""
    probe = ("import gc; from services.core.serving import tune_gc; tune_gc(); "
             "print(gc.get_freeze_count(), gc.get_threshold()[0])")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    frozen, threshold = map(int, out.stdout.split())
    assert frozen > 10_000 and threshold == GC_GEN0_THRESHOLD


def test_the_protocol_overrides_no_private_uvicorn_name() -> None:
    """A private method of uvicorn's protocol may change or vanish in any release: only public names
    (asyncio's protocol methods, the parser callbacks) are overridden, and none of ours shadows one."""
    inherited = {name for base in HeaderDeadlineProtocol.__mro__[1:] if base is not object for name in vars(base)}
    ours = {name for name in vars(HeaderDeadlineProtocol) if not (name.startswith("__") and name.endswith("__"))}
    overridden = ours & inherited
    assert overridden and not {name for name in overridden if name.startswith("_")}, overridden


def test_no_code_outside_tests_and_benchmarks_imports_httptools() -> None:
    sources = [p for top in ("services", "gateway", "gymserve", "trainer", "deploy") for p in (ROOT / top).rglob("*.py")]
    assert sources
    importing = [str(p.relative_to(ROOT)) for p in sources
                 if any(line.split("#")[0].strip().startswith(("import httptools", "from httptools"))
                        for line in p.read_text().splitlines())]
    assert importing == []
