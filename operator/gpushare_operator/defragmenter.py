"""Defragmentation by the operator, as the live `defragmentation` setting says (the leader
only, every `defragmentationIntervalSeconds`):
- `Off`: nothing;
- `Plan`: the plan for the pods waiting now (`scheduling.defrag.defrag_plan`, what `gpushare
  defrag` prints), told: a `DefragmentationPlan` Event on each waiting pod the plan would
  place by moving others (when what it says changes), and the metrics
  `gpushare_defrag_moves` and `gpushare_defrag_freeable_bytes`;
- `Auto`: the same, and the moves of one waiting pod carried out per interval (the rate
  limit): each moved pod evicted through the Eviction API (UID precondition, its
  PodDisruptionBudgets decide), a `Defragmented` Event on it, and the waiting pod nominated
  to the card being made whole, as a preempting pod is, so that no other pod takes it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.kube.retry import WRITE, retry
from gpushare.model import PodUid
from gpushare.model.defrag import Defragmentation, Room
from gpushare_operator.config import OperatorConfig
from gpushare_operator.election import WriteFence
from gpushare_operator.kubeapi import Fenced, SchedulerApi
from gpushare_operator.metrics import MIB, SchedulerMetrics
from gpushare_operator.reporting import Reporter
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.defrag import defrag_plan
from gpushare_operator.scheduling.gangs import GangBook

PLANNED = "DefragmentationPlan"
MOVED = "Defragmented"


class Defragmenter:
    def __init__(
        self,
        *,
        cache: SchedulerCache,
        gangs: GangBook,
        api: SchedulerApi,
        reporter: Reporter,
        metrics: SchedulerMetrics,
        config: Callable[[], OperatorConfig],
        fence: WriteFence,
    ) -> None:
        """`fence`: asked before each eviction."""
        self._cache = cache
        self._gangs = gangs
        self._fence = fence
        self._api = api
        self._reporter = reporter
        self._metrics = metrics
        self._config = config
        self._told: dict[PodUid, str] = {}
        self._log = logs.get("defrag")

    async def run(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self._config().defrag_interval_s)

    async def check(self) -> None:
        config = self._config()
        if config.defragmentation is Defragmentation.OFF:
            self._metrics.defrag_moves.set(0)
            self._metrics.defrag_freeable_bytes.set(0)
            return
        plan = defrag_plan(self._cache, self._gangs, config.policy)
        rooms = [room for room in plan.rooms if room.moves]
        self._metrics.defrag_moves.set(len(plan.moves))
        self._metrics.defrag_freeable_bytes.set(
            sum(room.freed_mib - room.free_before_mib for room in rooms) * MIB
        )
        for room in rooms:
            self._tell(room)
        self._told = {uid: m for uid, m in self._told.items() if uid in {r.pod.uid for r in rooms}}
        if config.defragmentation is Defragmentation.AUTO and rooms:
            await self._carry_out(rooms[0])

    def _tell(self, room: Room) -> None:
        where = f"node {room.placement.node} card {room.placement.cards[0]}"
        moves = "; ".join(
            f"{move.pod} ({move.mib} MiB) to node {move.to.node} card {move.to.cards[0]}"
            for move in room.moves
        )
        message = (
            f"moving {len(room.moves)} pod(s) would free {room.freed_mib} MiB on {where} "
            f"({room.free_before_mib} MiB free now) for this pod: {moves}"
        )
        if self._told.get(room.pod.uid) != message:
            self._told[room.pod.uid] = message
            self._reporter.event(room.pod, PLANNED, message)

    def _give_up(self, room: Room) -> None:
        self._cache.drop_nomination(room.pod.uid)
        self._cache.unreserve(room.pod.uid)

    async def _carry_out(self, room: Room) -> None:
        moved = frozenset(move.pod.uid for move in room.moves)
        self._cache.nominate(room.pod.uid, room.placement, moved)
        waiting = self._cache.pending(room.pod.uid)
        if waiting is not None:  # the card is its from now: no newer pod takes it meanwhile
            self._cache.reserve(waiting, room.placement)
        where = f"node {room.placement.node} card {room.placement.cards[0]}"
        for move in room.moves:
            try:
                self._fence.check(f"evict {move.pod}")
                await retry(functools.partial(self._api.evict, move.pod), WRITE)
            except (ApiError, OSError, TimeoutError, Fenced) as error:
                if isinstance(error, ApiError) and error.status == 404:
                    continue
                self._log.warning("defrag_eviction_refused", pod=str(move.pod), error=str(error))
                self._give_up(room)
                return
            except asyncio.CancelledError:  # the leadership is lost: the next leader decides
                self._give_up(room)
                raise
            self._log.info("defrag_moved", pod=str(move.pod), node=move.node, card=move.card)
            self._reporter.event(
                move.pod,
                MOVED,
                f"Evicted to make room on {where} for a waiting pod; its controller's "
                f"replacement is placed again",
            )
