"""A process worker pool for CPU-heavy or hang-prone work (sympy, math-verify, user code).

Why not `concurrent.futures.ProcessPoolExecutor`: it cannot kill one hung task, and a
crashed worker breaks the whole executor. Here every worker is a pre-started process
that runs items one at a time in its main thread (so SIGALRM-based libraries work);
the event loop watches each item's hard deadline, kills a hung or crashed worker,
fails only that item (`timeout` or `crash`), re-queues the items queued behind it,
and starts a replacement. Under load, several queued items go to a worker in one
message (micro-batching) to amortise the IPC cost; each still has its own deadline.

Small-item throughput: items submitted in one event-loop turn are dispatched together; a
worker streaming through quick items gets its next batch before it runs dry; the worker
sends results from a thread, so they leave in batches while it goes on; the parent reads
all pending results in one syscall. A shared-memory page tells the parent which item a
worker is on and since when, so deadlines and crash attribution stay per item although
results may lag a little. `benchmarks/pool_throughput.py` measures it.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import itertools
import logging
import mmap
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Callable, Iterable, Iterator

from .failures import FailureKind

log = logging.getLogger("gymserve.pool")


class WorkerFailure(Exception):
    """An item could not be run to completion for an infrastructure reason."""

    kind = FailureKind.CRASH


class WorkerTimeout(WorkerFailure):
    kind = FailureKind.TIMEOUT


class WorkerCrash(WorkerFailure):
    kind = FailureKind.CRASH


class PoolOverloaded(Exception):
    """The bounded queue is full and the caller asked not to wait."""


class PoolClosed(Exception):
    pass


class TaskError(Exception):
    """The function itself raised; `exc_type` is the original exception's class name."""

    def __init__(self, exc_type: str, message: str) -> None:
        super().__init__(f"{exc_type}: {message}")
        self.exc_type = exc_type
        self.message = message


# --------------------------------------------------------------------------- #
# Worker side
# --------------------------------------------------------------------------- #
def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# Shared with the parent (a memfd page): the id of the item running now (-1 between items)
# and when it started. Results leave through a thread and may lag a little; this tells the
# parent exactly which item a hung or crashed worker was on, and since when.
# The start is written before the id, and read after it, so a reader that sees a new id
# also sees its start time. After them, a ring of ids the parent gave to another worker
# (work stealing): the worker skips those it has not started yet. A missed or late entry
# only means the item runs twice; the parent keeps the first result.
_PROGRESS = struct.Struct("qd")
_ID = struct.Struct("q")
_START = struct.Struct("d")
_SKIP_SLOTS = 64
_PAGE_SIZE = _PROGRESS.size + _ID.size * _SKIP_SLOTS


def _worker_entry() -> None:
    """Entry of a worker interpreter: `python -c ... FD [PROGRESS_FD]`, FD one end of a socketpair."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    conn = Connection(int(sys.argv[1]))
    progress = mmap.mmap(int(sys.argv[2]), _PAGE_SIZE) if len(sys.argv) > 2 else None
    stolen = memoryview(progress)[_PROGRESS.size:].cast("q") if progress is not None else ()
    initializer, initargs = conn.recv()
    if initializer is not None:
        initializer(*initargs)
    conn.send(("ready", os.getpid()))
    outbox = _Outbox(conn)
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            outbox.close()
            return
        for item_id, fn, args, kwargs in batch:
            if item_id in stolen:
                outbox.put((item_id, None, None))  # another worker ran it
                continue
            if progress is not None:
                _START.pack_into(progress, _ID.size, time.monotonic())
                _ID.pack_into(progress, 0, item_id)
            try:
                reply = (item_id, True, fn(*args, **kwargs))
            except BaseException as exc:  # report, never die on the item's exception
                reply = (item_id, False, (type(exc).__name__, str(exc)[:2000]))
            if progress is not None:
                _ID.pack_into(progress, 0, -1)
            outbox.put(reply)


class _Outbox:
    """Sends results from a thread, so the main thread goes straight on to the next item.

    While the main thread works through quick items, results pile up and leave in one
    message (the thread gets the GIL at the interpreter's switch interval); when the main
    thread blocks (waiting for work, sleeping, in I/O) they leave at once. So a result is
    never held back behind a slow item for longer than a switch interval, and the parent
    keeps knowing which item a worker is on.
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.items: list[Any] = []
        self.cond = threading.Condition()
        self.closed = False
        self.thread = threading.Thread(target=self._run, name="gymserve-pool-outbox", daemon=True)
        self.thread.start()

    def put(self, reply: tuple[int, bool | None, Any]) -> None:
        with self.cond:
            self.items.append(reply)
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()
        self.thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.items and not self.closed:
                    self.cond.wait()
                replies, self.items = self.items, []
                closing = self.closed
            if replies:
                self._send(replies)
            if closing and not self.items:
                return

    def _send(self, replies: list[tuple[int, bool | None, Any]]) -> None:
        try:
            self.conn.send(replies)
            return
        except (OSError, EOFError):
            os._exit(0)  # the parent is gone
        except Exception:
            pass
        fixed = []  # some result cannot be pickled: find it, report it as the item's error
        for item_id, ok, value in replies:
            try:
                _dumps(value)
                fixed.append((item_id, ok, value))
            except Exception as exc:
                fixed.append((item_id, False, (type(exc).__name__, f"result could not be sent: {exc}"[:2000])))
        self.conn.send(fixed)


# --------------------------------------------------------------------------- #
# Parent side
# --------------------------------------------------------------------------- #
def _dumps(obj: Any) -> bytes:
    """Plain pickle: `multiprocessing`'s ForkingPickler costs more per call, and items carry no fds."""
    return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)


_FRAME = struct.Struct("!i")
_BIG_FRAME = struct.Struct("!iQ")


def _write_frame(fd: int, data: bytes) -> None:
    """`data` as one `multiprocessing.Connection` frame on the parent's non-blocking end.

    Written at once when the socket buffer has room (the usual case: no mode switches, one
    syscall); the rest of a message larger than the free space is written in blocking mode,
    draining as the worker reads. Event loops such as uvloop keep watched fds non-blocking.
    """
    header = _FRAME.pack(len(data)) if len(data) <= 0x7FFFFFFF else _BIG_FRAME.pack(-1, len(data))
    try:
        sent = os.writev(fd, [header, data])
    except (BlockingIOError, InterruptedError):
        sent = 0
    if sent == len(header) + len(data):
        return
    rest = memoryview(header + data)[sent:] if sent < len(header) else memoryview(data)[sent - len(header):]
    os.set_blocking(fd, True)
    try:
        while rest:
            rest = rest[os.write(fd, rest):]
    finally:
        os.set_blocking(fd, False)


_READ_CHUNK = 1 << 16  # a larger read buffer costs an mmap per read
# a batch for a worker that is still busy must fit in the socket buffer: a blocking send of
# more would stall the event loop until that worker finished its current item
_PIPELINE_MAX_BYTES = 64 * 1024
# a worker gets its next batch before it runs dry while its current item has run less than
# this or twice the average item time; a worker stuck on a slow item gets nothing queued behind it
_PIPELINE_RECENT_S = 0.002
# Micro-batches are sized so that one holds about this much work (from a running average of the
# pool's item times): quick items travel 16 to a message, items of a few ms go one at a time. A
# batch is a queue private to one worker; a long one would make an item wait behind slow
# neighbours while another worker idles (head-of-line blocking: the source of the p99 tail).
_BATCH_TARGET_S = 0.002
_ITEM_TIME_WEIGHT = 0.1  # weight of the newest sample in the running average


@dataclass(eq=False, slots=True)
class _Item:
    id: int
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    deadline_s: float
    future: asyncio.Future[Any]
    stolen: bool = False  # also sent to a second worker, which took it from behind a slow item


class _FairQueue:
    """Items waiting for a worker, taken round-robin across submissions.

    A `run` call is one submission, a `map` call (one request's batch) another: a large batch
    does not hold back the single items queued after it; they alternate with its items.
    """

    def __init__(self) -> None:
        self._groups: collections.deque[_Item | collections.deque[_Item]] = collections.deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[_Item]:
        for group in self._groups:
            if isinstance(group, _Item):
                yield group
            else:
                yield from group

    def add(self, item: _Item) -> None:
        self._groups.append(item)
        self._size += 1

    def add_group(self, items: Iterable[_Item]) -> None:
        group = collections.deque(items)
        if group:
            self._groups.append(group)
            self._size += len(group)

    def push_front(self, items: list[_Item]) -> None:
        """Items that were already dispatched once go back first, in their order."""
        self._groups.extendleft(reversed(items))
        self._size += len(items)

    def popleft(self) -> _Item:
        group = self._groups.popleft()
        self._size -= 1
        if type(group) is _Item:
            return group
        item = group.popleft()  # type: ignore[union-attr]
        if group:
            self._groups.append(group)
        return item

    def clear(self) -> None:
        self._groups.clear()
        self._size = 0


@dataclass(eq=False)
class _Worker:
    process: Any
    conn: Connection
    ready: bool = False
    inflight: collections.deque[_Item] = field(default_factory=collections.deque)
    item_started: float = 0.0
    dead: bool = False
    buffer: bytearray = field(default_factory=bytearray)
    progress: mmap.mmap | None = None
    skip_next: int = 0  # next slot of the stolen-ids ring in `progress`

    def mark_stolen(self, item_id: int) -> None:
        """Tell the worker to skip this item if it has not started it."""
        if self.progress is None or self.progress.closed:
            return
        _ID.pack_into(self.progress, _PROGRESS.size + _ID.size * self.skip_next, item_id)
        self.skip_next = (self.skip_next + 1) % _SKIP_SLOTS

    def stranded(self, now: float, slow_after_s: float) -> list[_Item]:
        """Items queued behind the item this worker has been on for over `slow_after_s`."""
        if len(self.inflight) < 2:
            return []
        running = self.running()
        if running is None or now - running[1] < slow_after_s:
            return []
        items = list(self.inflight)
        for index, item in enumerate(items):
            if item.id == running[0]:
                return [i for i in items[index + 1:] if not i.stolen and not i.future.done()]
        return []

    def running(self) -> tuple[int, float] | None:
        """(id, start) of the item the worker is running, from shared memory; None if unknown."""
        if self.progress is None or self.progress.closed:
            return None
        (item_id,) = _ID.unpack_from(self.progress, 0)
        if item_id < 0:
            return None
        (started,) = _START.unpack_from(self.progress, _ID.size)
        return (item_id, started) if 0.0 < started <= time.monotonic() else None


class WorkerPool:
    """Pre-started worker processes with hard per-item deadlines and a bounded queue.

    `await pool.run(fn, *args)` returns `fn(*args)` computed in a worker, or raises
    `WorkerTimeout`, `WorkerCrash`, `TaskError` (fn raised) or `PoolOverloaded`.
    `fn` must be importable (a module-level function).
    """

    def __init__(self, size: int | None = None, *, deadline_s: float = 10.0, max_queue: int = 4096,
                 max_batch: int = 16, initializer: Callable[..., Any] | None = None,
                 initargs: tuple[Any, ...] = (), name: str = "pool", start_timeout_s: float = 120.0) -> None:
        self.size = max(1, size or os.cpu_count() or 1)
        self.deadline_s = deadline_s
        self.max_queue = max_queue
        self.max_batch = max(1, max_batch)
        self.initializer = initializer
        self.initargs = initargs
        self.name = name
        self.start_timeout_s = start_timeout_s
        self.stats = collections.Counter(restarts=0, timeouts=0, crashes=0, completed=0, errors=0, stolen=0)
        self._workers: list[_Worker] = []
        self._pending = _FairQueue()
        self._ids = itertools.count()
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._closed = False
        self._all_ready: asyncio.Event | None = None
        self._dispatch_scheduled = False
        self._steal_timer: asyncio.TimerHandle | None = None
        self.item_time_s: float | None = None  # running average of item time (None: nothing measured yet)

    # ---- lifecycle -------------------------------------------------------- #
    async def start(self) -> "WorkerPool":
        """Start every worker and wait until each has run its initializer."""
        self._loop = asyncio.get_running_loop()
        self._slots = asyncio.Semaphore(self.max_queue)
        self._all_ready = asyncio.Event()
        for _ in range(self.size):
            self._spawn()
        try:
            await asyncio.wait_for(self._all_ready.wait(), self.start_timeout_s)
        except asyncio.TimeoutError:
            await self.close()
            raise RuntimeError(f"{self.name}: workers did not start within {self.start_timeout_s}s") from None
        if self._closed:
            raise RuntimeError(f"{self.name}: workers failed to start (initializer crashed?)")
        self._watchdog = asyncio.create_task(self._watch())
        return self

    async def __aenter__(self) -> "WorkerPool":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def ready(self) -> bool:
        return bool(self._all_ready and self._all_ready.is_set()) and not self._closed

    @property
    def queued(self) -> int:
        return len(self._pending)

    @property
    def busy(self) -> int:
        return sum(1 for w in self._workers if w.inflight)

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if not w.dead]

    async def close(self) -> None:
        if self._closed and not self._workers:
            return
        self._closed = True
        if self._steal_timer is not None:
            self._steal_timer.cancel()
        if self._watchdog:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        for item in self._pending:
            if not item.future.done():
                item.future.set_exception(PoolClosed(f"{self.name} closed"))
        self._pending.clear()
        for worker in list(self._workers):
            with contextlib.suppress(Exception):
                worker.conn.send(None)
        deadline = time.monotonic() + 1.0
        for worker in list(self._workers):
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            self._kill(worker, None)
        self._workers.clear()

    # ---- submitting ------------------------------------------------------- #
    async def run(self, fn: Callable[..., Any], *args: Any, deadline_s: float | None = None,
                  wait: bool = True, **kwargs: Any) -> Any:
        if self._closed or self._loop is None or self._slots is None:
            raise PoolClosed(f"{self.name} is not running")
        if not wait and self._slots.locked():
            raise PoolOverloaded(f"{self.name}: queue full ({self.max_queue} items)")
        async with self._slots:
            future: asyncio.Future[Any] = self._loop.create_future()
            self._pending.add(_Item(next(self._ids), fn, args, kwargs, deadline_s or self.deadline_s, future))
            self._schedule_dispatch()
            return await future

    async def map(self, fn: Callable[..., Any], argument_tuples: list[tuple[Any, ...]],
                  deadline_s: float | None = None) -> list[Any]:
        """Run many items; each result is a value or the exception that item raised.

        Cheaper per item than gathering `run` calls: no task or semaphore round per item.
        At most `max_queue` items of one call are queued at a time (backpressure).
        """
        if self._closed or self._loop is None:
            raise PoolClosed(f"{self.name} is not running")
        deadline = deadline_s or self.deadline_s
        args = list(argument_tuples)
        results: list[Any] = []
        for start in range(0, len(args), self.max_queue):
            futures = [self._loop.create_future() for _ in range(min(self.max_queue, len(args) - start))]
            ids = self._ids
            self._pending.add_group(_Item(next(ids), fn, tuple(a), {}, deadline, f)
                                 for a, f in zip(args[start:start + len(futures)], futures))
            self._schedule_dispatch()
            results.extend(await asyncio.gather(*futures, return_exceptions=True))
        return results

    # ---- internals -------------------------------------------------------- #
    def _spawn(self) -> None:
        # A fresh interpreter rather than multiprocessing's spawn: it never re-imports the
        # parent's __main__, so scripts without a `__main__` guard work too.
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        progress_fd, progress = -1, None
        with contextlib.suppress(AttributeError, OSError):  # memfd is Linux-only; then we do without
            progress_fd = os.memfd_create("gymserve-pool-progress")
            os.ftruncate(progress_fd, _PAGE_SIZE)
            progress = mmap.mmap(progress_fd, _PAGE_SIZE)
            _PROGRESS.pack_into(progress, 0, -1, 0.0)
            for slot in range(_SKIP_SLOTS):
                _ID.pack_into(progress, _PROGRESS.size + _ID.size * slot, -1)
        fds = (theirs.fileno(),) + ((progress_fd,) if progress is not None else ())
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", "from services.core.pool import _worker_entry; _worker_entry()",
                 *map(str, fds)],
                pass_fds=fds, env=env, stdin=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
            if progress_fd >= 0:
                os.close(progress_fd)
        parent_conn = Connection(ours.detach())
        parent_conn.send((self.initializer, self.initargs))
        os.set_blocking(parent_conn.fileno(), False)  # reads take what is there; see _write_frame
        worker = _Worker(process=process, conn=parent_conn, progress=progress)
        self._workers.append(worker)
        assert self._loop is not None
        self._loop.add_reader(parent_conn.fileno(), self._on_readable, worker)

    def _on_readable(self, worker: _Worker) -> None:
        """Read everything the worker has sent in one go (many results per syscall under load)."""
        if worker.dead:
            return
        fd = worker.conn.fileno()
        eof = False
        try:
            while True:
                chunk = os.read(fd, _READ_CHUNK)
                if not chunk:
                    eof = True
                    break
                worker.buffer += chunk
                if len(chunk) < _READ_CHUNK:
                    break
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            eof = True
        self._handle_messages(worker)
        if eof:
            self._on_worker_died(worker)
            return
        self._dispatch()

    def _handle_messages(self, worker: _Worker) -> None:
        """Decode the complete `multiprocessing.Connection` frames in the worker's buffer."""
        buf = worker.buffer
        view = memoryview(buf)
        pos, end = 0, len(buf)
        try:
            while end - pos >= 4 and not worker.dead:
                (size,) = struct.unpack_from("!i", buf, pos)
                header = 4
                if size == -1:
                    if end - pos < 12:
                        break
                    (size,) = struct.unpack_from("!Q", buf, pos + 4)
                    header = 12
                if end - pos - header < size:
                    break
                message = pickle.loads(view[pos + header:pos + header + size])
                pos += header + size
                if not worker.ready:
                    worker.ready = True
                    self._check_all_ready()
                    continue
                if type(message) is list:
                    for reply in message:
                        self._on_result(worker, reply)
                else:
                    self._on_result(worker, message)
        finally:
            view.release()
            del buf[:pos]

    def _check_all_ready(self) -> None:
        if self._all_ready and not self._all_ready.is_set() and all(w.ready for w in self._workers):
            self._all_ready.set()

    def _on_result(self, worker: _Worker, message: tuple[int, bool | None, Any]) -> None:
        item_id, ok, value = message
        if not worker.inflight or worker.inflight[0].id != item_id:
            return  # a result for an item we already gave up on
        item = worker.inflight.popleft()
        now = time.monotonic()
        if ok is None:  # skipped: another worker ran it
            worker.item_started = now
            return
        took = now - worker.item_started
        self.item_time_s = took if self.item_time_s is None else \
            self.item_time_s + _ITEM_TIME_WEIGHT * (took - self.item_time_s)
        worker.item_started = now
        if item.future.done():
            return
        if ok:
            self.stats["completed"] += 1
            item.future.set_result(value)
        else:
            self.stats["errors"] += 1
            item.future.set_exception(TaskError(*value))

    def _on_worker_died(self, worker: _Worker) -> None:
        if worker.dead:
            return
        code = worker.process.poll()
        if code is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = worker.process.wait(timeout=0.2)
        if not worker.ready and not self._closed:
            log.error("%s: a worker died while starting (exit code %s)", self.name, code)
        self._fail_current(worker, WorkerCrash(f"worker process died (exit code {code}) while running the item"))
        self.stats["crashes"] += 1
        self._replace(worker)

    def _current(self, worker: _Worker) -> tuple[_Item, float]:
        """The item a busy worker is on and since when: from shared memory when it names one of
        ours, else the oldest unanswered item, timed from its predecessor's result."""
        running = worker.running()
        if running is not None:
            for item in worker.inflight:
                if item.id == running[0]:
                    return item, running[1]
        return worker.inflight[0], worker.item_started

    def _fail_current(self, worker: _Worker, error: WorkerFailure) -> None:
        """Fail the item the worker was on; every other unanswered item runs again elsewhere
        (those before it finished, but their results died with the worker)."""
        if not worker.inflight:
            return
        guilty, _ = self._current(worker)
        items = list(worker.inflight)
        worker.inflight.clear()
        if not guilty.future.done():
            guilty.future.set_exception(error)
        self._pending.push_front([item for item in items if item is not guilty])

    def _kill(self, worker: _Worker, _: Any) -> None:
        worker.dead = True
        if worker.progress is not None:
            with contextlib.suppress(Exception):
                worker.progress.close()
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(worker.conn.fileno())
        with contextlib.suppress(Exception):
            worker.process.kill()
        with contextlib.suppress(Exception):
            worker.conn.close()
        with contextlib.suppress(Exception):
            worker.process.wait(timeout=1.0)

    def _replace(self, worker: _Worker) -> None:
        self._kill(worker, None)
        with contextlib.suppress(ValueError):
            self._workers.remove(worker)
        if self._closed:
            return
        self.stats["restarts"] += 1
        self._spawn()
        if self._all_ready and not self._all_ready.is_set() and not any(w.ready for w in self._workers):
            # a worker that cannot even start: stop instead of spinning forever
            if self.stats["restarts"] > 3 * self.size:
                self._closed = True
                self._all_ready.set()

    def _schedule_dispatch(self) -> None:
        """Dispatch once per event-loop turn, so items submitted together travel together."""
        if not self._dispatch_scheduled and self._loop is not None:
            self._dispatch_scheduled = True
            self._loop.call_soon(self._dispatch)

    def _take(self, count: int) -> list[_Item]:
        batch: list[_Item] = []
        while self._pending and len(batch) < count:
            item = self._pending.popleft()
            if not item.future.done():  # a cancelled caller
                batch.append(item)
        return batch

    def _encode(self, batch: list[_Item]) -> tuple[bytes | None, list[_Item]]:
        """Pickle a batch; an item that cannot be pickled fails alone (TaskError), the rest go."""
        try:
            return _dumps([(i.id, i.fn, i.args, i.kwargs) for i in batch]), batch
        except Exception:
            good = []
            for item in batch:
                try:
                    _dumps((item.id, item.fn, item.args, item.kwargs))
                    good.append(item)
                except Exception as exc:
                    if not item.future.done():
                        item.future.set_exception(TaskError(type(exc).__name__, f"item could not be sent: {exc}"))
            if not good:
                return None, []
            return _dumps([(i.id, i.fn, i.args, i.kwargs) for i in good]), good

    def _send(self, worker: _Worker, batch: list[_Item], *, pipelined: bool) -> None:
        data, batch = self._encode(batch)
        if data is None:
            return
        if pipelined and len(data) > _PIPELINE_MAX_BYTES:
            self._pending.push_front(batch)  # too big to queue behind a busy worker
            return
        try:
            _write_frame(worker.conn.fileno(), data)
        except OSError:
            self._pending.push_front(batch)  # the watchdog notices the dead worker
            return
        if not worker.inflight:
            worker.item_started = time.monotonic()
        worker.inflight.extend(batch)

    def batch_limit(self) -> int:
        """Items per message now: ~`_BATCH_TARGET_S` of work, at least 1, at most `max_batch`."""
        if self.item_time_s is None:
            return 1  # nothing measured yet: the first items go one at a time
        return max(1, min(self.max_batch, int(_BATCH_TARGET_S / max(self.item_time_s, 1e-6))))

    def _steal(self, live: list[_Worker], idle: list[_Worker], now: float, slow_after_s: float) -> list[_Worker]:
        """Idle workers take the items stranded behind a slow item on another worker, oldest
        first (they were dispatched before anything still pending). Returns the workers still idle."""
        stranded = sorted(((item, w) for w in live for item in w.stranded(now, slow_after_s)),
                          key=lambda pair: pair[0].id)
        if not stranded:
            if any(len(w.inflight) > 1 for w in live) and self._loop is not None and self._steal_timer is None:
                # look again once the items queued behind a running one may count as stranded
                self._steal_timer = self._loop.call_later(slow_after_s, self._on_steal_timer)
            return idle
        limit = self.batch_limit()
        still_idle = []
        for index, worker in enumerate(idle):
            if not stranded:
                still_idle.append(worker)
                continue
            count = min(limit, -(-len(stranded) // (len(idle) - index)))
            taken, stranded = stranded[:count], stranded[count:]
            for item, victim in taken:
                item.stolen = True
                victim.mark_stolen(item.id)
            self.stats["stolen"] += len(taken)
            self._send(worker, [item for item, _ in taken], pipelined=False)
        return still_idle

    def _on_steal_timer(self) -> None:
        self._steal_timer = None
        self._schedule_dispatch()

    def _dispatch(self) -> None:
        self._dispatch_scheduled = False
        live = [w for w in self._workers if w.ready and not w.dead]
        idle = [w for w in live if not w.inflight]
        now = time.monotonic()
        recent = max(_PIPELINE_RECENT_S, 2 * (self.item_time_s or 0.0))
        if idle:
            idle = self._steal(live, idle, now, recent)
        if not self._pending:
            return
        limit = self.batch_limit()
        for worker in idle:
            if not self._pending:
                return
            share = -(-len(self._pending) // len(idle))
            batch = self._take(min(limit, share))
            if batch:
                self._send(worker, batch, pipelined=False)
        if not self._pending:
            return
        # Workers churning through quick items get their next batch before they run dry, so
        # they do not idle for a round trip between batches.
        # So do workers on an item of ordinary cost; one on an item that has run far past the
        # average gets nothing queued behind it (it may be a slow one); if one turns out slow
        # after its next batch was sent, idle workers steal that batch (`_steal`).
        streaming = [w for w in live if w.inflight and len(w.inflight) <= limit
                     and now - w.item_started < recent]
        for worker in streaming:
            if not self._pending:
                return
            share = -(-len(self._pending) // len(streaming))
            batch = self._take(min(limit, share))
            if batch:
                self._send(worker, batch, pipelined=True)

    async def _watch(self) -> None:
        while not self._closed:
            await asyncio.sleep(0.05)
            now = time.monotonic()
            for worker in list(self._workers):
                if worker.dead or not worker.inflight:
                    continue
                item, started = self._current(worker)
                if now - started > item.deadline_s:
                    log.warning("%s: item exceeded its %.1fs deadline; killing worker pid %s",
                                self.name, item.deadline_s, worker.process.pid)
                    self.stats["timeouts"] += 1
                    self._fail_current(worker, WorkerTimeout(f"exceeded the {item.deadline_s:g}s deadline"))
                    self._replace(worker)
                elif worker.process.poll() is not None:
                    self._on_worker_died(worker)
            self._dispatch()
