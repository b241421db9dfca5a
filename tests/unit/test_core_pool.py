"""The core worker pool: deadlines, crashes, recovery, backpressure (real processes)."""
from __future__ import annotations

import asyncio

import pytest

from services.core.pool import PoolOverloaded, TaskError, WorkerCrash, WorkerPool, WorkerTimeout
from tests.unit import pool_fns


@pytest.mark.timeout(30)  # a sleeper that blocked the pool would sleep its 60 s
async def test_sleeping_item_times_out_while_others_flow():
    async with WorkerPool(2, deadline_s=1.0) as pool:
        sleeper = asyncio.ensure_future(pool.run(pool_fns.sleep, 60))
        results = await asyncio.gather(*(pool.run(pool_fns.add, i, 1) for i in range(200)))
        assert results == [i + 1 for i in range(200)]
        with pytest.raises(WorkerTimeout, match="exceeded the 1s deadline"):
            await sleeper
        assert pool.stats["timeouts"] == 1
        assert await pool.run(pool_fns.add, 2, 2) == 4


@pytest.mark.parametrize("killer", [pool_fns.exit_hard, pool_fns.segfault])
async def test_crashing_item_fails_as_crash_and_pool_recovers(killer):
    async with WorkerPool(2, deadline_s=5.0) as pool:
        before = set(pool.pids())
        outcome = await asyncio.gather(pool.run(killer), pool.run(pool_fns.add, 1, 2), return_exceptions=True)
        assert isinstance(outcome[0], WorkerCrash)
        assert outcome[1] == 3
        assert await pool.map(pool_fns.add, [(i, i) for i in range(20)]) == [2 * i for i in range(20)]
        assert len(pool.pids()) == 2 and set(pool.pids()) != before


async def test_function_exception_is_a_task_error_not_a_crash():
    async with WorkerPool(1) as pool:
        with pytest.raises(TaskError) as info:
            await pool.run(pool_fns.fail, "boom")
        assert info.value.exc_type == "ValueError" and "boom" in str(info.value)
        assert pool.stats["crashes"] == 0


async def test_bounded_queue_backpressure():
    async with WorkerPool(1, deadline_s=5.0, max_queue=2) as pool:
        first = [asyncio.ensure_future(pool.run(pool_fns.sleep, 0.3)) for _ in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(PoolOverloaded):
            await pool.run(pool_fns.add, 1, 1, wait=False)
        assert await pool.run(pool_fns.add, 1, 1) == 2  # waits for a slot instead
        await asyncio.gather(*first)
