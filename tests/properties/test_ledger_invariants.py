"""Invariants of the model under any sequence of placements and releases."""

from __future__ import annotations

from dataclasses import dataclass

from builders import capacity_node, gpu_pod, gpunode_resource
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.model import (
    Allocation,
    GpuKind,
    Ledger,
    NodeInventory,
    Placement,
    PodRequest,
    PodUid,
    Policy,
    claim_of,
    node_inventory,
    place,
    pod_ref,
)

CARD_SIZES = st.sampled_from([1000, 11178, 16384, 40960, 81559])


@st.composite
def inventories(draw: st.DrawFn) -> list[NodeInventory]:
    found = []
    for n in range(draw(st.integers(1, 4))):
        sizes = draw(st.lists(CARD_SIZES, min_size=1, max_size=4))
        unhealthy = tuple(draw(st.sets(st.integers(0, len(sizes) - 1), max_size=1)))
        name = f"node-{n}"
        inventory = node_inventory(
            capacity_node(name, 0, 0), gpunode_resource(name, sizes, unhealthy=unhealthy)
        )
        assert inventory is not None
        found.append(inventory)
    return found


@dataclass(frozen=True)
class Place:
    request: PodRequest
    policy: Policy


@dataclass(frozen=True)
class Release:
    which: int


REQUESTS = st.one_of(
    st.builds(
        lambda units: PodRequest(kind=GpuKind.MEMORY, total=units, containers=()),
        st.integers(1, 45000),
    ),
    st.builds(
        lambda count: PodRequest(kind=GpuKind.NUMBER, total=count, containers=()), st.integers(1, 3)
    ),
)
STEPS = st.lists(
    st.one_of(
        st.builds(Place, REQUESTS, st.sampled_from(list(Policy))),
        st.builds(Release, st.integers(0, 1000)),
    ),
    max_size=40,
)


def fresh(nodes: list[NodeInventory]) -> Ledger:
    ledger = Ledger()
    for inventory in nodes:
        ledger.set_node(inventory)
    return ledger


def snapshot(ledger: Ledger) -> dict[tuple[str, int], tuple[int, int, frozenset[str]]]:
    return {
        (name, index): (card.used, card.exclusive, frozenset(card.pods))
        for name, usage in ledger.nodes().items()
        for index, card in usage.cards.items()
    }


def as_pod(allocation: Allocation) -> dict[str, object]:
    memory = allocation.amount if allocation.kind is GpuKind.MEMORY else None
    number = allocation.amount if allocation.kind is GpuKind.NUMBER else None
    return gpu_pod(
        allocation.pod.name,
        memory,
        number=number,
        node=allocation.node,
        index=allocation.annotations()["volcano.sh/gpu-index"],
        uid=allocation.pod.uid,
    )


def check_invariants(ledger: Ledger) -> None:
    for usage in ledger.nodes().values():
        for card in usage.cards.values():
            assert card.used <= card.card.memory, "a card is overcommitted"
            assert card.free >= 0
            if card.exclusive:
                assert card.exclusive == 1, "a whole card is held twice"
                assert len(card.pods) == 1, "a whole card is shared"
                assert card.used == 0


@settings(max_examples=300, deadline=None)
@given(nodes=inventories(), steps=STEPS)
def test_no_sequence_overcommits_a_card_or_shares_a_whole_one(
    nodes: list[NodeInventory], steps: list[Place | Release]
) -> None:
    ledger = fresh(nodes)
    placed: list[PodUid] = []
    for number, step in enumerate(steps):
        if isinstance(step, Place):
            result = place(ledger, step.request, step.policy)
            if isinstance(result, Placement):
                pod = gpu_pod(f"pod-{number}", 1, uid=f"uid-{number}")
                ledger.add(result.allocation(pod_ref(pod)))
                placed.append(PodUid(f"uid-{number}"))
        elif placed:
            ledger.release(placed.pop(step.which % len(placed)))
        check_invariants(ledger)

    rebuilt = fresh(nodes)
    for allocation in ledger.allocations():
        claim = claim_of(as_pod(allocation))
        assert claim.problem is None
        assert claim.allocation == allocation
        rebuilt.add(claim.allocation)
    assert snapshot(rebuilt) == snapshot(ledger), "annotations do not reproduce the usage"


@settings(max_examples=300, deadline=None)
@given(nodes=inventories(), steps=STEPS, need=st.integers(1, 45000))
def test_bestfit_leaves_no_more_free_memory_than_firstfit_and_is_the_true_optimum(
    nodes: list[NodeInventory], steps: list[Place | Release], need: int
) -> None:
    ledger = fresh(nodes)
    for number, step in enumerate(steps):
        if isinstance(step, Place):
            result = place(ledger, step.request, step.policy)
            if isinstance(result, Placement):
                ledger.add(result.allocation(pod_ref(gpu_pod(f"p{number}", 1))))
    request = PodRequest(kind=GpuKind.MEMORY, total=need, containers=())
    best = place(ledger, request, Policy.BESTFIT)
    first = place(ledger, request, Policy.FIRSTFIT)
    assert isinstance(best, Placement) == isinstance(first, Placement)
    if isinstance(best, Placement) and isinstance(first, Placement):
        assert best.free_after <= first.free_after
        # The indexed walk finds exactly what scoring every card would.
        scored = min(
            (card.free - need, name, index)
            for name, usage in ledger.nodes().items()
            if usage.free >= need
            for index, card in usage.cards.items()
            if card.shareable and card.free >= need
        )
        assert (best.free_after, best.node, best.cards[0]) == scored
