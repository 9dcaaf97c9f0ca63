"""The operator's intake and decision loop on one cache, without a process or an apiserver: the
unit tests of what a decision leaves behind (a bind's answer, a gang's preemption) drive it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from gpushare_operator.config import OperatorConfig
from gpushare_operator.election import WriteFence
from gpushare_operator.intake import Intake
from gpushare_operator.labeller import Labeller
from gpushare_operator.metrics import SchedulerMetrics
from gpushare_operator.reporting import Reporter
from gpushare_operator.scheduler import Scheduler
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.gangs import GangBook
from gpushare_operator.scheduling.queue import SchedulingQueue


def decision_loop(
    api: object,
    config: OperatorConfig,
    *,
    queue_clock: Callable[[], float] = time.monotonic,
    may_write: Callable[[], bool] = lambda: True,
) -> tuple[Scheduler, Intake]:
    """The scheduler and its intake (no node yet), making every call of theirs to `api`: the
    cache's clock stands at 1000 s, the queue's is `queue_clock`, and `may_write` says
    whether this replica's Lease is fresh."""
    current = lambda: config  # noqa: E731
    intake = Intake(
        cache=SchedulerCache(config=current, clock=lambda: 1000.0),
        queue=SchedulingQueue(config=current, clock=queue_clock),
        gangs=GangBook(),
        reporter=Reporter(api=api),  # type: ignore[arg-type]  # the calls a test scripts
        labeller=Labeller(api=None, fence=WriteFence(lambda: True), binds=bool),  # type: ignore[arg-type]  # never run here
    )
    scheduler = Scheduler(
        cache=intake.cache,
        queue=intake.queue,
        gangs=intake.gangs,
        api=api,  # type: ignore[arg-type]
        reporter=intake.reporter,
        metrics=SchedulerMetrics(),
        config=current,
        findings=intake.findings,
        fence=WriteFence(may_write),
        volume_changes=intake.volume_changes,
    )
    return scheduler, intake


async def run_a_while(scheduler: Scheduler, intake: Intake) -> None:
    """The decision loop, the findings and the reports, until what is queued is done."""
    async with running(scheduler, intake):
        await settle()


@contextlib.asynccontextmanager
async def running(scheduler: Scheduler, intake: Intake) -> AsyncIterator[None]:
    """The decision loop, the findings and the reports, until the block ends (binds in
    flight are cancelled then)."""
    tasks = [
        asyncio.create_task(scheduler.run()),
        asyncio.create_task(intake.take_findings()),
        asyncio.create_task(intake.reporter.run()),
    ]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def settle() -> None:
    """Until what is queued is done (what waits on an event, waits on)."""
    for _ in range(200):
        await asyncio.sleep(0)
