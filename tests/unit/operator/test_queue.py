"""The scheduling queue on a fake clock: order, backoff, parking and waking."""

from __future__ import annotations

from gpushare.model import PodUid
from gpushare_operator.config import OperatorConfig
from gpushare_operator.scheduling.queue import SchedulingQueue


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def queue(clock: Clock) -> SchedulingQueue:
    config = OperatorConfig(backoff_initial_s=1, backoff_max_s=10, unschedulable_retry_s=60)
    return SchedulingQueue(config=lambda: config, clock=clock)


def uid(name: str) -> PodUid:
    return PodUid(name)


def test_higher_priority_first_then_first_come_first_served() -> None:
    q = queue(Clock())
    q.add(uid("a"))
    q.add(uid("b"), priority=10)
    q.add(uid("c"))
    assert [q.pop_ready(), q.pop_ready(), q.pop_ready(), q.pop_ready()] == ["b", "a", "c", None]


def test_a_woken_pod_keeps_its_place_before_pods_that_came_later() -> None:
    q = queue(Clock())
    q.add(uid("first"))
    assert q.pop_ready() == "first"
    q.park(uid("first"), wake_key="2048 MiB")
    q.add(uid("second"))
    q.add(uid("third"))
    q.wake("2048 MiB")
    assert [q.pop_ready(), q.pop_ready(), q.pop_ready()] == ["first", "second", "third"]


def test_a_failed_bind_backs_off_exponentially_up_to_the_maximum() -> None:
    clock = Clock()
    q = queue(clock)
    delays = [q.backoff(uid("a")) for _ in range(6)]
    assert delays == [1, 2, 4, 8, 10, 10]
    assert q.pop_ready() is None
    clock.now += 10
    assert q.pop_ready() == "a"


def test_a_parked_pod_waits_for_a_wake_or_the_retry_interval() -> None:
    clock = Clock()
    q = queue(clock)
    q.add(uid("a"))
    assert q.pop_ready() == "a"
    q.park(uid("a"))
    clock.now += 30
    assert q.pop_ready() is None
    clock.now += 30
    assert q.pop_ready() == "a"


def test_a_wake_never_retries_a_pod_sooner_than_its_backoff() -> None:
    clock = Clock()
    q = queue(clock)
    q.add(uid("a"))
    assert q.pop_ready() == "a"
    q.park(uid("a"))
    q.wake()  # at once: the pod was tried a moment ago
    assert q.pop_ready() is None
    clock.now += 1
    assert q.pop_ready() == "a"


def test_a_keyed_wake_retries_only_the_pods_it_can_help() -> None:
    clock = Clock()
    q = queue(clock)
    for name in ("a", "b"):
        q.add(uid(name))
        q.pop_ready()
    q.park(uid("a"), wake_key="1024 MiB")
    q.park(uid("b"), wake_key="2048 MiB")
    clock.now += 5
    q.wake("1024 MiB")
    assert q.pop_ready() == "a"
    assert q.pop_ready() is None


def test_a_park_with_a_known_deadline_retries_then() -> None:
    clock = Clock()
    q = queue(clock)
    q.add(uid("a"))
    q.pop_ready()
    q.park(uid("a"), retry_in_s=3)
    assert q.next_due_in() == 3
    clock.now += 3
    assert q.pop_ready() == "a"


def test_a_removed_pod_is_never_returned() -> None:
    q = queue(Clock())
    q.add(uid("a"))
    q.remove(uid("a"))
    assert q.pop_ready() is None
    assert q.depth().active == 0


def test_members_parked_by_their_gangs_decision_back_off_with_it() -> None:
    clock = Clock()
    q = queue(clock)
    for name in ("m1", "m2", "m3"):
        q.add(uid(name))
    assert q.pop_ready() == "m1"
    for name in ("m1", "m2", "m3"):  # the gang's decision parks every member
        q.park(uid(name), wake_key="gang")
    for _ in range(20):  # a stream of pods going away: no member is tried at each one
        clock.now += 0.05
        q.wake()
        assert q.pop_ready() is None
    clock.now += 1
    assert q.pop_ready() == "m1"
