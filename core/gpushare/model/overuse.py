"""Over-use of a share, judged from what the device plugin measured: pure, no I/O.

A container is over its share on a card while its processes hold more there than it was
granted (on a card it was not given, anything). Held for `grace_s` in a row, that is an
episode, acted on once by the policy (`OverUsePolicy`): `Warn` says so (an Event on the pod, a
metric), `Evict` also evicts the pod through the Eviction API (its PodDisruptionBudgets
decide; a refused eviction is tried again after another grace period). Only the container's
own pod is ever acted on: never a neighbour on the card, never a pod within its share, never a
process that maps to no container (`MeasuredUsage.unmapped_mib`). A measurement older than
`max_age_s` (a device plugin that stopped measuring) ends every episode of its node.
"""

from __future__ import annotations

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
    evict: bool

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
            f"on node {self.node} card {use.card} but {share}, for {self.over_for_s:.0f} s: its "
            f"neighbours on the card may run out of memory. Lower its use (a framework limit "
            f"it ignores or overrides?) or ask for more volcano.sh/gpu-memory"
        )


_Key = tuple[str, PodUid, str, CardIndex]


@dataclass(slots=True)
class OverUseWatch:
    """The episodes in progress, per node, container and card."""

    _since: dict[_Key, float] = field(default_factory=dict)
    _acted: dict[_Key, OverUsePolicy] = field(default_factory=dict)
    """The policy each episode was acted on under: a warned episode is acted on again
    (evicted) once the policy becomes Evict."""

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
    ) -> list[OverUse]:
        """What to act on now, given `node`'s latest measurement (None: none, or unreadable),
        taken at `measured_at` (unix seconds)."""
        fresh = measured is not None and measured_at is not None and now - measured_at <= max_age_s
        over = {
            (node, use.pod.uid, use.container, use.card): use
            for use in (measured.containers if fresh and measured is not None else ())
            if use.over
        }
        for key in [key for key in self._since if key[0] == node and key not in over]:
            del self._since[key]  # the episode ended: within its share again, or gone
            self._acted.pop(key, None)
        actions = []
        for key, use in over.items():
            since = self._since.setdefault(key, now)
            if policy is OverUsePolicy.IGNORE or now - since < grace_s:
                continue
            if self._acted.get(key) in (policy, OverUsePolicy.EVICT):
                continue  # acted on already, as this policy would
            self._acted[key] = policy
            actions.append(
                OverUse(node, use, over_for_s=now - since, evict=policy is OverUsePolicy.EVICT)
            )
        return actions

    def retry_later(self, action: OverUse, now: float) -> None:
        """The action could not be carried out (an eviction a PodDisruptionBudget refused):
        try again after another grace period."""
        key = (action.node, action.use.pod.uid, action.use.container, action.use.card)
        self._acted.pop(key, None)
        self._since[key] = now

    def forget_node(self, node: str) -> None:
        for key in [key for key in self._since if key[0] == node]:
            del self._since[key]
            self._acted.pop(key, None)
