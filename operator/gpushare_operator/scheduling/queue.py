"""The scheduling queue: which pending pod is tried next, and when a failed one is retried.

Three places, as in kube-scheduler's PriorityQueue:
- active: ready now; higher `spec.priority` first, then first come, first served (by when
  the pod first came, so a pod tried again keeps its place before later ones: a burst is
  placed in creation order, as the model places it one by one);
- backoff: a bind failed; retried after 1 s, 2 s, 4 s ... up to the maximum;
- parked: unschedulable; retried when the cluster changes in a way that could help (`wake`:
  a node changed, a pod went away or was assigned, a GPUNode changed) or, at the latest,
  after `unschedulable_retry_s`, never in a hot loop: a woken pod that was tried less than
  its backoff ago (1 s, 2 s, ... per failed attempt) waits out the rest in backoff, as
  kube-scheduler's queue does, so a stream of events cannot make one pod retry endlessly.
  A keyed wake (the assignment of the pod a same-request pod waits for) is the one event
  such a pod waits on, once per assignment: it is tried at once.

Beside pods, the decision loop takes two other kinds of work from here, queued by the intake
and acted on before the next pod: a gang that lost a member, to check whether what it holds
must be released (`check_gang`, `GangCheck`); and a card a terminating pod is about to free,
to be claimed for the pod waiting longest that it would let fit (`card_freeing`,
`CardFreeing`), before a newer pod (a controller's replacement, say) takes it.

Time comes from an injected clock, so tests drive it without sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from gpushare.kube.retry import Backoff
from gpushare.model import CardIndex, NodeName, PodUid
from gpushare.model.gangs import GroupKey
from gpushare_operator.config import OperatorConfig


@dataclass(frozen=True, slots=True)
class GangCheck:
    """A gang lost a member: check it (`gangs.broken_gang`) before the next pod."""

    group: GroupKey


@dataclass(frozen=True, slots=True)
class CardFreeing:
    """A pod holding `card` of `node` began terminating: the pod waiting longest that its
    memory would let fit is nominated to it before newer pods are decided."""

    node: NodeName
    card: CardIndex


@dataclass(frozen=True, slots=True)
class Depth:
    active: int
    backoff: int
    parked: int


class SchedulingQueue:
    def __init__(
        self,
        *,
        config: Callable[[], OperatorConfig],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._config = config
        self._clock = clock
        self._order = itertools.count()
        self._active: list[tuple[int, int, int, PodUid]] = []
        self._arrival: dict[PodUid, int] = {}
        self._in_active: dict[PodUid, int] = {}
        self._backoff: list[tuple[float, int, PodUid]] = []
        self._ready_at: dict[PodUid, float] = {}
        self._parked: dict[PodUid, float] = {}  # until when
        self._wake_keys: dict[PodUid, Hashable] = {}
        self._tried_at: dict[PodUid, float] = {}
        self._attempts: dict[PodUid, int] = {}
        self._priority: dict[PodUid, int] = {}
        self._gang_checks: dict[GroupKey, None] = {}  # in order, each once
        self._freeing: dict[CardFreeing, None] = {}
        self._changed = asyncio.Event()

    def add(self, uid: PodUid, priority: int = 0) -> None:
        """A pod to schedule, new or updated: active now, unless it is backing off."""
        self._priority[uid] = priority
        self._parked.pop(uid, None)
        if uid in self._ready_at:
            return
        self._activate(uid)

    def remove(self, uid: PodUid) -> None:
        """The pod is bound or gone: forget it entirely."""
        self._in_active.pop(uid, None)
        self._ready_at.pop(uid, None)
        self._parked.pop(uid, None)
        self._attempts.pop(uid, None)
        self._priority.pop(uid, None)
        self._wake_keys.pop(uid, None)
        self._tried_at.pop(uid, None)
        self._arrival.pop(uid, None)

    def backoff(self, uid: PodUid) -> float:
        """Retry after an error; returns the delay."""
        attempts = self._attempts.get(uid, 0) + 1
        self._attempts[uid] = attempts
        delay = self._delay(attempts)
        self._in_active.pop(uid, None)
        self._parked.pop(uid, None)
        self._back_off_until(uid, self._clock() + delay)
        return delay

    def _delay(self, attempts: int) -> float:
        config = self._config()
        return Backoff(config.backoff_initial_s, config.backoff_max_s).delay(attempts)

    def _back_off_until(self, uid: PodUid, ready: float) -> None:
        self._ready_at[uid] = ready
        heapq.heappush(self._backoff, (ready, next(self._order), uid))
        self._changed.set()

    def park(self, uid: PodUid, retry_in_s: float | None = None, wake_key: Hashable = None) -> None:
        """Unschedulable now: wait for a helpful change, or the retry interval (or
        `retry_in_s`, when something is known to change by then). `wake_key` lets a change
        that can only help some pods wake just those (`wake(key)`)."""
        now = self._clock()
        self._in_active.pop(uid, None)
        self._wake_keys[uid] = wake_key
        self._attempts[uid] = self._attempts.get(uid, 0) + 1
        # A try for this pod although another was popped (a gang decides for all its
        # members): its backoff counts from now too, so a stream of wakes cannot make the
        # gang be decided again at each one.
        self._tried_at[uid] = now
        most = self._config().unschedulable_retry_s
        wait = most if retry_in_s is None else min(retry_in_s, most)
        self._parked[uid] = now + wait
        self._changed.set()

    def wake(self, key: Hashable = None) -> None:
        """The cluster changed: parked pods get another try: all of them, after what is left
        of their backoff; or with `key` only those parked with that wake key, at once."""
        now = self._clock()
        for uid in list(self._parked):
            if key is None or self._wake_keys.get(uid) == key:
                del self._parked[uid]
                due = self._tried_at.get(uid, 0.0) + self._delay(self._attempts.get(uid, 1))
                if due > now and key is None:
                    self._back_off_until(uid, due)
                else:
                    self._activate(uid)

    def check_gang(self, group: GroupKey) -> None:
        """Queue a check of `group`, which lost a member."""
        self._gang_checks[group] = None
        self._changed.set()

    def card_freeing(self, node: NodeName, card: CardIndex) -> None:
        """Queue a claim on a card that a terminating pod is about to free."""
        self._freeing[CardFreeing(node, card)] = None
        self._changed.set()

    def depth(self) -> Depth:
        return Depth(
            active=len(self._in_active), backoff=len(self._ready_at), parked=len(self._parked)
        )

    def pop_ready(self) -> PodUid | None:
        """The next pod to try now, if any (moving due backoffs and stale parkings first)."""
        now = self._clock()
        while self._backoff and self._backoff[0][0] <= now:
            ready, _, uid = heapq.heappop(self._backoff)
            if self._ready_at.get(uid) == ready:
                del self._ready_at[uid]
                self._activate(uid)
        for uid, until in list(self._parked.items()):
            if until <= now:
                del self._parked[uid]
                self._activate(uid)
        while self._active:
            _, _, order, uid = heapq.heappop(self._active)
            if self._in_active.get(uid) == order:
                del self._in_active[uid]
                self._tried_at[uid] = now
                return uid
        return None

    def next_due_in(self) -> float | None:
        """Seconds until a backoff or parking runs out (None: nothing is waiting)."""
        dues = list(self._ready_at.values())
        dues += list(self._parked.values())
        if not dues:
            return None
        return max(0.0, min(dues) - self._clock())

    async def pop(self) -> PodUid | GangCheck | CardFreeing:
        """Wait for the next work: a gang to check, a card being freed, else the next pod."""
        while True:
            self._changed.clear()
            if self._gang_checks:
                group = next(iter(self._gang_checks))
                del self._gang_checks[group]
                return GangCheck(group)
            if self._freeing:
                freeing = next(iter(self._freeing))
                del self._freeing[freeing]
                return freeing
            uid = self.pop_ready()
            if uid is not None:
                return uid
            due = self.next_due_in()
            try:
                async with asyncio.timeout(due):
                    await self._changed.wait()
            except TimeoutError:
                pass

    def _activate(self, uid: PodUid) -> None:
        order = next(self._order)
        arrival = self._arrival.setdefault(uid, order)
        self._in_active[uid] = order
        heapq.heappush(self._active, (-self._priority.get(uid, 0), arrival, order, uid))
        self._changed.set()
