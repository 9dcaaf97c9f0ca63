"""What people see of the scheduler's refusals, with scripted apiserver answers: one
FailedScheduling Event per pod, its count raised as the diagnosis changes; nothing said of a pod
that changed meanwhile; a refused or busy write reported again, never lost in silence."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from gpushare.kube import ApiError
from gpushare.kube.http2 import STREAMS
from gpushare.model import PodRef, PodUid
from gpushare_operator.reporting import (
    EVENT_WORKERS,
    FAILED_SCHEDULING,
    REFUSAL_WORKERS,
    SCHEDULED,
    Reporter,
)

pytestmark = pytest.mark.asyncio

POD = PodRef(namespace="team-a", name="train", uid=PodUid("u1"))


class Api:
    """Records each write; `answers` scripts the errors the next writes get, in order."""

    def __init__(self, *answers: ApiError | None, pod: dict[str, Any] | None = None) -> None:
        self.answers: Iterator[ApiError | None] = iter(answers)
        self.writes: list[tuple[str, Any]] = []
        self.wrote = asyncio.Event()
        self.pod = pod
        """What a read of the pod answers (None: it is gone)."""

    async def until(self, done: Callable[[], bool]) -> None:
        """Until the writes so far make `done` true (5 s at most)."""
        async with asyncio.timeout(5):
            while not done():
                self.wrote.clear()
                await self.wrote.wait()

    async def reach(self, count: int) -> None:
        """Until `count` writes were made."""
        await self.until(lambda: len(self.writes) >= count)

    def _answer(self, what: str, detail: Any) -> None:
        self.writes.append((what, detail))
        self.wrote.set()
        error = next(self.answers, None)
        if error is not None:
            raise error

    async def set_unschedulable(
        self, pod: PodRef, reason: str, message: str, version: int | None, **__: Any
    ) -> None:
        self._answer("condition", (message, version))

    async def read_pod(self, pod: PodRef) -> dict[str, Any] | None:
        return self.pod

    async def post_event(self, pod: PodRef, *, event_type: str, reason: str, message: str) -> str:
        self._answer("event", (reason, message))
        return f"{pod.name}.1"

    async def repeat_event(self, namespace: str, name: str, *, message: str, count: int) -> None:
        self._answer("repeat", (name, message, count))


@contextlib.asynccontextmanager
async def running(api: Api) -> AsyncIterator[Reporter]:
    """A reporter writing to `api` while the block runs."""
    reporter = Reporter(api)  # type: ignore[arg-type]  # its four writes are all it makes
    task = asyncio.create_task(reporter.run())
    try:
        yield reporter
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def reported(api: Api, *reports: tuple[str, int, int]) -> list[tuple[str, Any]]:
    """Run the reporter over `reports` (message, resourceVersion, the writes made by then),
    one after the other."""
    async with running(api) as reporter:
        for message, version, writes in reports:
            reporter.unschedulable(POD, message, version, already=False)
            await api.reach(writes)
            for _ in range(20):  # let the worker finish the report
                await asyncio.sleep(0)
    return api.writes


async def test_a_changed_diagnosis_raises_the_count_of_the_one_event() -> None:
    writes = await reported(Api(), ("no room", 1, 2), ("still no room", 2, 4))
    assert writes == [
        ("condition", ("no room", 1)),
        ("event", (FAILED_SCHEDULING, "no room")),
        ("condition", ("still no room", 2)),
        ("repeat", ("train.1", "still no room", 2)),
    ]


async def test_an_event_gone_from_the_apiserver_is_posted_again() -> None:
    gone = ApiError(404, 'events "train.1" not found')
    writes = await reported(Api(None, None, None, gone), ("no room", 1, 2), ("still no room", 2, 5))
    assert writes[-2:] == [
        ("repeat", ("train.1", "still no room", 2)),
        ("event", (FAILED_SCHEDULING, "still no room")),
    ]


CHANGED = ApiError(409, "the object has been modified")


def read(*, node: str | None, version: str = "7") -> dict[str, Any]:
    """The pod as a read answers it: bound to `node`, or pending (not yet marked)."""
    return {"metadata": {"resourceVersion": version}, "spec": {"nodeName": node}, "status": {}}


async def test_a_pod_bound_since_the_decision_is_not_called_unschedulable() -> None:
    # 409, and the pod is bound now: no write, no Event; the same message, on a later
    # refusal of a pod pending again, is reported.
    writes = await reported(Api(CHANGED, pod=read(node="n")), ("no room", 1, 1), ("no room", 3, 3))
    assert writes == [
        ("condition", ("no room", 1)),
        ("condition", ("no room", 3)),
        ("event", (FAILED_SCHEDULING, "no room")),
    ]


async def test_a_newer_reason_is_written_over_the_pods_own_earlier_report() -> None:
    # The first report changed the pod, so the second decision's version is stale (409).
    # The pod is still pending: the newer reason is written at once at its version now,
    # not when its backoff next has it refused.
    api = Api(None, None, CHANGED, pod=read(node=None, version="7"))
    writes = await reported(api, ("1 of 2 pods exist", 1, 2), ("cannot be placed together", 1, 5))
    assert writes[2:] == [
        ("condition", ("cannot be placed together", 1)),
        ("condition", ("cannot be placed together", 7)),
        ("repeat", ("train.1", "cannot be placed together", 2)),
    ]


async def test_a_pod_gone_or_changed_twice_is_left_to_its_next_refusal() -> None:
    gone = await reported(Api(CHANGED, pod=None), ("no room", 1, 1), ("no room", 2, 3))
    assert gone == [
        ("condition", ("no room", 1)),
        ("condition", ("no room", 2)),  # not remembered as said: its next refusal reports
        ("event", (FAILED_SCHEDULING, "no room")),
    ]
    twice = Api(CHANGED, CHANGED, pod=read(node=None, version="7"))
    writes = await reported(twice, ("no room", 1, 2), ("no room", 8, 4))
    assert writes == [
        ("condition", ("no room", 1)),
        ("condition", ("no room", 7)),
        ("condition", ("no room", 8)),
        ("event", (FAILED_SCHEDULING, "no room")),
    ]


async def test_a_busy_apiserver_is_waited_for_and_a_refusal_reported_again_later() -> None:
    busy = ApiError(429, "too many requests", retry_after_s=0)
    refused = ApiError(403, 'events is forbidden: User "system:serviceaccount:x" cannot create')
    writes = await reported(Api(busy, None, refused), ("no room", 1, 3), ("no room", 2, 5))
    assert writes == [
        ("condition", ("no room", 1)),  # 429: tried again
        ("condition", ("no room", 1)),
        ("event", (FAILED_SCHEDULING, "no room")),  # 403: logged; not remembered as said
        ("condition", ("no room", 2)),
        ("event", (FAILED_SCHEDULING, "no room")),
    ]


class Overtaken(Api):
    """The older reason's write is answered only once the newer one has landed, and then
    with a conflict (the newer write changed the pod), as two workers can race."""

    OLDER, NEWER = "1 of 2 pods exist", "cannot be placed together"

    def __init__(self) -> None:
        super().__init__(pod=read(node=None, version="7"))
        self.newer_landed = asyncio.Event()

    async def set_unschedulable(
        self, pod: PodRef, reason: str, message: str, version: int | None, **__: Any
    ) -> None:
        if message == self.OLDER and version == 1:
            await self.newer_landed.wait()
            self.writes.append(("condition", (message, version)))
            raise CHANGED
        self.writes.append(("condition", (message, version)))
        self.newer_landed.set()


async def test_an_older_reason_never_overwrites_a_newer_one_that_landed_first() -> None:
    api = Overtaken()
    async with running(api) as reporter:
        reporter.unschedulable(POD, Overtaken.OLDER, 1, already=False)
        reporter.unschedulable(POD, Overtaken.NEWER, 1, already=False)
        await api.until(lambda: ("event", (FAILED_SCHEDULING, Overtaken.NEWER)) in api.writes)
        for _ in range(50):  # let the older report's worker finish
            await asyncio.sleep(0)
    conditions = [detail for what, detail in api.writes if what == "condition"]
    assert conditions[-1][0] == Overtaken.NEWER
    assert ("event", (FAILED_SCHEDULING, Overtaken.OLDER)) not in api.writes


class Held(Api):
    """Every write waits until `release` is set; `most` is the most in flight at once."""

    def __init__(self) -> None:
        super().__init__(pod=read(node=None))
        self.release = asyncio.Event()
        self.in_flight = 0
        self.most = 0

    async def _held(self, what: str, detail: Any) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self._answer(what, detail)
        await self.release.wait()
        self.in_flight -= 1

    async def post_event(self, pod: PodRef, *, event_type: str, reason: str, message: str) -> str:
        await self._held("event", (reason, message))
        return f"{pod.name}.1"

    async def set_unschedulable(
        self, pod: PodRef, reason: str, message: str, version: int | None, **__: Any
    ) -> None:
        await self._held("condition", (message, version))


def pods(count: int, prefix: str) -> list[PodRef]:
    return [
        PodRef(namespace="team-a", name=f"{prefix}-{n}", uid=PodUid(f"{prefix}-{n}"))
        for n in range(count)
    ]


async def test_a_bursts_scheduled_events_are_sent_side_by_side_refusals_a_few_at_a_time() -> None:
    # A slow apiserver: the burst's Scheduled Events go out together, as kube-scheduler's do,
    # not one after another; refusals, on the connections the Lease shares, a few at a time.
    api = Held()
    async with running(api) as reporter:
        for pod in pods(100, "bound"):
            reporter.bound(pod, "node-1", None)
        for pod in pods(10, "pending"):
            reporter.unschedulable(pod, "no room", 1, already=False)
        await api.reach(EVENT_WORKERS + REFUSAL_WORKERS)
        for _ in range(20):  # nothing more is sent while these are held
            await asyncio.sleep(0)
        assert api.most == EVENT_WORKERS + REFUSAL_WORKERS < STREAMS  # Bindings keep some
        assert sum(what == "condition" for what, _ in api.writes) == REFUSAL_WORKERS
        api.release.set()
        # every Event, every condition and its Event
        await api.reach(100 + 2 * 10)
    announced = [
        detail for what, detail in api.writes if what == "event" and detail[0] == SCHEDULED
    ]
    assert len(announced) == 100


async def test_a_pod_bound_while_its_refusal_is_written_gets_no_failed_scheduling_event() -> None:
    # The condition's write is answered only after the pod was bound: its FailedScheduling
    # Event would come after the Scheduled one, which now goes out at once.
    api = Held()
    async with running(api) as reporter:
        reporter.unschedulable(POD, "no room", 1, already=False)
        await api.reach(1)
        reporter.bound(POD, "node-1", None)
        api.release.set()
        await api.reach(2)
        for _ in range(50):  # let the refusal's worker finish
            await asyncio.sleep(0)
    assert [what for what, _ in api.writes] == ["condition", "event"]
    assert api.writes[1][1][0] == SCHEDULED
