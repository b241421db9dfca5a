"""The pool does not strand requests: items queued behind a slow item on one worker are taken by
an idle worker (and skipped by the slow one), and a large batch does not hold back single items
submitted after it (round-robin across submissions). Assertions are on order and placement."""
from __future__ import annotations

import asyncio

from services.core.pool import WorkerPool
from tests.unit import pool_fns


async def test_items_behind_a_slow_item_move_to_an_idle_worker():
    async with WorkerPool(2, deadline_s=20.0) as pool:
        await pool.map(pool_fns.add, [(i, 1) for i in range(200)])  # quick items: batches of up to 16
        assert pool.batch_limit() > 4
        done: list[str] = []
        slow = asyncio.ensure_future(pool.run(pool_fns.pid_after, 3.0))
        slow.add_done_callback(lambda _: done.append("slow"))
        await asyncio.sleep(0)  # the slow item goes first, alone in its submission
        quick = asyncio.ensure_future(pool.map(pool_fns.pid_after, [(0.0,)] * 30))
        quick.add_done_callback(lambda _: done.append("quick"))
        pids = await quick
        slow_pid = await slow
        assert done == ["quick", "slow"]  # none of the quick items waited for the slow one
        assert all(isinstance(p, int) for p in pids)
        assert slow_pid not in pids  # every quick item ran on the other worker
        assert pool.stats["stolen"] > 0  # some had been queued behind the slow item, then moved
        assert pool.stats["completed"] == 200 + 31  # each item counted once: the slow worker skipped the moved ones


async def test_single_items_are_not_held_back_by_a_large_batch():
    async with WorkerPool(1, deadline_s=20.0) as pool:
        order: list[str] = []

        async def batch() -> None:
            for _ in await pool.map(pool_fns.sleep, [(0.05,)] * 20):
                pass
            order.append("batch")

        async def single() -> None:
            await pool.run(pool_fns.sleep, 0.05)
            order.append("single")

        big = asyncio.ensure_future(batch())
        await asyncio.sleep(0.01)  # the batch is queued first
        await asyncio.gather(single(), big)
        assert order == ["single", "batch"]
