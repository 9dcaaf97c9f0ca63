"""The exactness rule (docs/architecture.md, "The exactness rule").

The kubelet's Allocate names device ids, never the pod, so two pods on one node with the same
request signature, both not yet `gpu-assigned`, must hold the same card; otherwise the device
plugin could not tell them apart. A bound pod that waits for its assignment is a `Pin`; while
it waits, other cards of its node are held back for pods of its signature, until it is
assigned or `assignment_timeout_s` has passed (then they go ahead, and the scheduler says so).
A node whose device plugin learns the pod from the kubelet's records (its GPUNode says
`identifiesPods`) holds nothing back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpushare.model import CardIndex, GpuKind, NodeName, PodRef, PodRequest
from gpushare.model.request import Signature
from gpushare.model.usage import PodUid


@dataclass(frozen=True, slots=True)
class Pin:
    """A pod bound to `cards` of `node` that the device plugin has not yet assigned."""

    ref: PodRef
    node: NodeName
    signature: Signature
    cards: tuple[CardIndex, ...]
    since: float
    """When its wait began, by the operator's own clock (its bind, or the first time the cache
    saw it bound): the wait ends `assignment_timeout_s` later."""


class Pins:
    """The pods waiting for their assignment, by signature and node, and when each node last
    had a pod assigned (its kubelet's progress)."""

    def __init__(self) -> None:
        self._pins: dict[Signature, dict[NodeName, dict[PodUid, Pin]]] = {}
        self._progress: dict[NodeName, float] = {}

    def add(self, pin: Pin) -> None:
        self._pins.setdefault(pin.signature, {}).setdefault(pin.node, {})[pin.ref.uid] = pin

    def remove(self, pin: Pin) -> None:
        by_node = self._pins.get(pin.signature, {})
        waiting = by_node.get(pin.node, {})
        waiting.pop(pin.ref.uid, None)
        if not waiting:
            by_node.pop(pin.node, None)
        if not by_node:
            self._pins.pop(pin.signature, None)

    def assigned(self, pin: Pin, at: float) -> None:
        """The device plugin assigned `pin`'s pod at `at`: its node's kubelet is making
        progress."""
        self.remove(pin)
        self._progress[pin.node] = max(at, self._progress.get(pin.node, at))

    def forget_node(self, node: NodeName) -> None:
        self._progress.pop(node, None)

    def check(
        self,
        request: PodRequest,
        namespace: str,
        *,
        now: float,
        timeout_s: float,
        identifies_pods: Callable[[NodeName], bool],
    ) -> ExactnessCheck:
        """The rule for a pod of `namespace` with `request`, at `now`; none on a node where
        `identifies_pods`."""
        return ExactnessCheck(
            self._pins.get(request.signature, {}),
            request.kind,
            namespace,
            progress=self._progress,
            now=now,
            timeout_s=timeout_s,
            identifies_pods=identifies_pods,
        )


class ExactnessCheck:
    """The exactness rule as a CardCheck for one decision: cards of a node held back because
    an earlier pod of the same signature there is not yet assigned. It remembers what it saw:
    waits that ran out (to log) and when the first live wait ends (to retry then)."""

    def __init__(
        self,
        pins: Mapping[NodeName, Mapping[PodUid, Pin]],
        gpu_kind: GpuKind | None,
        namespace: str,
        *,
        progress: Mapping[NodeName, float],
        now: float,
        timeout_s: float,
        identifies_pods: Callable[[NodeName], bool],
    ) -> None:
        self._pins = pins
        self._identifies_pods = identifies_pods
        self._gpu_kind = gpu_kind
        self._namespace = namespace
        self._progress = progress
        self._now = now
        self._timeout_s = timeout_s
        self.expired: dict[PodUid, PodRef] = {}
        self.first_wait_ends_in: float | None = None
        self._rules: dict[NodeName, tuple[frozenset[CardIndex], str] | None] = {}

    def stalled_s(self, node: NodeName) -> float:
        """How long pods of this signature on `node` have waited for their assignment with
        no pod of the node assigned meanwhile (0 when none waits): a kubelet that admits
        slowly but steadily is not stalled; one that admits nothing is."""
        since = [
            pin.since
            for pin in self._pins.get(node, {}).values()
            if pin.since + self._timeout_s > self._now
        ]
        if not since:
            return 0.0
        return self._now - max(min(since), self._progress.get(node, min(since)))

    def __call__(self, node: NodeName, card: CardIndex) -> str | None:
        if node not in self._rules:
            self._rules[node] = self._rule(node)
        rule = self._rules[node]
        if rule is None or card in rule[0]:
            return None
        return rule[1]

    def _rule(self, node: NodeName) -> tuple[frozenset[CardIndex], str] | None:
        """For `node`: None (no live wait), or (the only cards allowed, why the rest are not)."""
        if self._identifies_pods(node):
            return None
        allowed: frozenset[CardIndex] | None = None
        waiting: Pin | None = None
        for uid, pin in self._pins.get(node, {}).items():
            left = pin.since + self._timeout_s - self._now
            if left < 0:
                self.expired[uid] = pin.ref
                continue
            if self.first_wait_ends_in is None or left < self.first_wait_ends_in:
                self.first_wait_ends_in = left
            # A gpu-memory pod may join the waiting pod's card; whole cards never coincide.
            same = frozenset(pin.cards) if self._gpu_kind is GpuKind.MEMORY else frozenset()
            allowed = same if allowed is None else allowed & same
            waiting = pin
        if waiting is None:
            return None
        shown = ",".join(map(str, waiting.cards))
        # The reason reaches the waiting pod's Events: a pod of another namespace is not named.
        who = (
            f"pod {waiting.ref}"
            if waiting.ref.namespace == self._namespace
            else "a pod of another namespace"
        )
        reason = (
            f"held back until {who} (same request, card {shown}) is assigned by the device plugin"
        )
        return (allowed or frozenset(), reason)
