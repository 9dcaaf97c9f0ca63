"""Over-use of a share, judged from what the device plugin measured: pure, no I/O.

A container is over its share on a card while its processes hold more there than it was
granted (on a card it was not given, anything). An episode begins when it is first seen over
and ends only once it has stayed within its share for `grace_s` (a container that dips under
its share for a measurement, or a card NVML could not list once, does not start it afresh);
over again `grace_s` after it began, it is acted on, once, by the policy (`OverUsePolicy`):
`Warn` says so (an Event on the pod, a metric), `Evict` also evicts the pod through the
Eviction API (its PodDisruptionBudgets decide; a refused eviction is tried again after another
grace period; with `delete_after_s`, once evictions were refused that long the pod is deleted
instead, as an admin who opts in asks: a PodDisruptionBudget allowing no disruption, which a
tenant may create, would otherwise keep an over-user running for ever). Only the container's
own pod is ever acted on: never a neighbour on the card,
never a pod within its share, never a process that maps to no container
(`MeasuredUsage.unmapped_mib`), never a container whose grant is not known. A measurement
older than `max_age_s` (a device plugin that stopped measuring) ends every episode of its
node.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field
from enum import StrEnum

from gpushare.model.annotations import CardIndex
from gpushare.model.measured import ContainerUse, MeasuredUsage
from gpushare.model.usage import PodUid


class OverUsePolicy(StrEnum):
    IGNORE = "Ignore"
    WARN = "Warn"
    EVICT = "Evict"


@dataclass(frozen=True, slots=True)
class OverUse:
    """An episode to act on: `use` has been over its share for `over_for_s`."""

    node: str
    use: ContainerUse
    over_for_s: float
    """Since its episode began (dips within the share shorter than the grace included)."""
    evict: bool
    delete: bool = False
    """Its evictions were refused for the admin's `delete_after_s`: delete the pod instead."""
    refused_for_s: float | None = None
    """Since its first eviction a PodDisruptionBudget refused, if any."""

    @property
    def message(self) -> str:
        use = self.use
        share = (
            f"was granted {use.granted_mib} MiB there"
            if use.granted_mib
            else "was not given that card"
        )
        return (
            f"container {use.container} of pod {use.pod} holds {use.used_mib} MiB of GPU memory "
            f"on node {self.node} card {use.card} but {share}, and has been over it for "
            f"{self.over_for_s:.0f} s: its neighbours on the card may run out of memory. "
            f"Lower its use (a framework limit it ignores or overrides?) or ask for more "
            f"volcano.sh/gpu-memory"
        )


_Key = tuple[str, PodUid, str, CardIndex]


@dataclass(slots=True)
class _Episode:
    began: float
    last_over: float
    """When it was last seen over its share."""
    retry_at: float | None = None
    """Not acted on before this, after an action that could not be carried out."""
    refused_since: float | None = None
    """When a PodDisruptionBudget first refused its eviction."""
    acted: OverUsePolicy | None = None
    """The policy it was acted on under: a warned episode is acted on again (evicted) once the
    policy becomes Evict."""


@dataclass(slots=True)
class OverUseWatch:
    """The episodes in progress, per node, container and card."""

    _episodes: dict[_Key, _Episode] = field(default_factory=dict)

    def observe(
        self,
        node: str,
        measured: MeasuredUsage | None,
        *,
        measured_at: float | None,
        now: float,
        policy: OverUsePolicy,
        grace_s: float,
        max_age_s: float,
        delete_after_s: float = 0.0,
    ) -> list[OverUse]:
        """What to act on now, given `node`'s latest measurement (None: none, or unreadable),
        taken at `measured_at` (unix seconds); `delete_after_s` (0: never) the time evictions
        may be refused by PodDisruptionBudgets before an over-user is deleted."""
        fresh = measured is not None and measured_at is not None and now - measured_at <= max_age_s
        over = {
            (node, use.pod.uid, use.container, use.card): use
            for use in (measured.containers if fresh and measured is not None else ())
            if use.over
        }
        for key, episode in list(self._episodes.items()):
            # Within its share again (or not measured, or gone) for a whole grace period: the
            # episode ended. Not measured fresh at all: nothing said is believed.
            ended = not fresh or now - episode.last_over >= grace_s
            if key[0] == node and key not in over and ended:
                del self._episodes[key]
        actions = []
        for key, use in over.items():
            episode = self._episodes.setdefault(key, _Episode(began=now, last_over=now))
            episode.last_over = now
            if policy is not OverUsePolicy.EVICT:
                episode.refused_since = None  # refusals count while evictions are asked
            if policy is OverUsePolicy.IGNORE or now - episode.began < grace_s:
                continue
            if episode.retry_at is not None and now < episode.retry_at:
                continue
            if episode.acted in (policy, OverUsePolicy.EVICT):
                continue  # acted on already, as this policy would
            episode.acted = policy
            evict = policy is OverUsePolicy.EVICT
            refused_for = None if episode.refused_since is None else now - episode.refused_since
            actions.append(
                OverUse(
                    node,
                    use,
                    over_for_s=now - episode.began,
                    evict=evict,
                    delete=evict
                    and delete_after_s > 0
                    and refused_for is not None
                    and refused_for >= delete_after_s,
                    refused_for_s=refused_for,
                )
            )
        return actions

    def retry_later(
        self, action: OverUse, now: float, *, after_s: float, by_budget: bool = False
    ) -> None:
        """The action could not be carried out (an eviction refused, the apiserver out of
        reach): try again in `after_s`, if the episode lasts. `by_budget`: a
        PodDisruptionBudget refused the eviction (what `delete_after_s` counts)."""
        key = (action.node, action.use.pod.uid, action.use.container, action.use.card)
        episode = self._episodes.get(key)
        if episode is None:
            return
        episode.acted = None
        episode.retry_at = now + after_s
        if by_budget and episode.refused_since is None:
            episode.refused_since = now

    def keep_nodes(self, nodes: Set[str]) -> None:
        """Forget the episodes of every node but these (their GPUNodes are gone)."""
        for key in [key for key in self._episodes if key[0] not in nodes]:
            del self._episodes[key]
