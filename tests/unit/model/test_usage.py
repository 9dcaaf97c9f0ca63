"""Per-card usage rebuilt from pod annotations, and kept incrementally."""

from __future__ import annotations

import pytest
from builders import capacity_node, gpu_pod, gpunode_resource

from gpushare.model import (
    Allocation,
    CardIndex,
    InvalidAnnotation,
    Ledger,
    NodeName,
    PodUid,
    check_allocation,
    claim_of,
    node_inventory,
)

NODE = NodeName("gpu-1")


def ledger_with(*pods: dict[str, object], memory: int = 89424, number: int = 8) -> Ledger:
    ledger = Ledger()
    inventory = node_inventory(capacity_node(NODE, memory, number))
    assert inventory is not None
    ledger.set_node(inventory)
    for pod in pods:
        claim = claim_of(pod)
        if claim.allocation is not None:
            ledger.add(claim.allocation)
    return ledger


def card(ledger: Ledger, index: int) -> tuple[int, int, int]:
    usage = ledger.node(NODE)
    assert usage is not None
    state = usage.cards[CardIndex(index)]
    return state.used, state.free, len(state.pods)


def test_the_guides_two_pods_share_card_zero() -> None:
    ledger = ledger_with(
        gpu_pod("gpu-pod1", 1024, node=NODE, index="0"),
        gpu_pod("gpu-pod2", 1024, node=NODE, index="0"),
    )
    assert card(ledger, 0) == (2048, 11178 - 2048, 2)
    assert card(ledger, 1) == (0, 11178, 0)


def test_finished_and_unbound_pods_hold_nothing() -> None:
    ledger = ledger_with(
        gpu_pod("done", 1024, node=NODE, index="0", phase="Succeeded"),
        gpu_pod("failed", 1024, node=NODE, index="0", phase="Failed"),
        gpu_pod("pending", 1024, index="0"),
    )
    assert card(ledger, 0) == (0, 11178, 0)


def test_a_whole_card_pod_makes_its_cards_exclusive() -> None:
    ledger = ledger_with(gpu_pod("train", number=2, node=NODE, index="3,5"))
    usage = ledger.node(NODE)
    assert usage is not None
    assert [i for i, c in sorted(usage.cards.items()) if not c.shareable] == [3, 5]
    assert card(ledger, 3)[1] == 0
    assert usage.idle_cards == 6


def test_a_pod_without_gpu_index_counts_against_the_node_total() -> None:
    pod = gpu_pod("foreign", 4096, node=NODE)
    claim = claim_of(pod)
    assert claim.problem is not None
    assert "without volcano.sh/gpu-index" in claim.problem
    ledger = ledger_with(pod)
    usage = ledger.node(NODE)
    assert usage is not None
    assert usage.unattributed_memory == 4096
    assert usage.free == 89424 - 4096


def test_a_malformed_gpu_index_is_reported_and_still_counted() -> None:
    for raw in ("a", "0,,1", " 1"):
        claim = claim_of(gpu_pod("odd", 1000, node=NODE, index=raw))
        assert claim.problem is not None
        assert "volcano.sh/gpu-index" in claim.problem
        ledger = ledger_with(gpu_pod("odd", 1000, node=NODE, index=raw))
        usage = ledger.node(NODE)
        assert usage is not None
        assert usage.unattributed_memory == 1000


def test_a_gpu_index_naming_a_missing_card_counts_against_the_node_total() -> None:
    ledger = ledger_with(gpu_pod("ghost", 1000, node=NODE, index="12"))
    usage = ledger.node(NODE)
    assert usage is not None
    assert usage.unattributed_memory == 1000
    assert all(c.used == 0 for c in usage.cards.values())


def test_forged_annotations_overcommit_a_card_but_free_memory_never_goes_negative() -> None:
    ledger = ledger_with(*(gpu_pod(f"forged-{i}", 6000, node=NODE, index="0") for i in range(3)))
    assert card(ledger, 0) == (18000, 0, 3)
    usage = ledger.node(NODE)
    assert usage is not None
    assert usage.free == 7 * 11178


def test_a_pod_on_an_unhealthy_card_stays_counted_there() -> None:
    ledger = Ledger()
    inventory = node_inventory(capacity_node(NODE, 89424, 8, unhealthy="0"))
    assert inventory is not None
    ledger.set_node(inventory)
    claim = claim_of(gpu_pod("p", 1024, node=NODE, index="0"))
    assert claim.allocation is not None
    ledger.add(claim.allocation)
    assert card(ledger, 0)[0] == 1024
    usage = ledger.node(NODE)
    assert usage is not None
    assert not usage.cards[CardIndex(0)].shareable


def test_pods_seen_before_their_node_are_attributed_when_it_arrives() -> None:
    ledger = Ledger()
    claim = claim_of(gpu_pod("early", 2048, node=NODE, index="2"))
    assert claim.allocation is not None
    ledger.add(claim.allocation)
    inventory = node_inventory(capacity_node(NODE, 89424, 8))
    assert inventory is not None
    ledger.set_node(inventory)
    assert card(ledger, 2) == (2048, 11178 - 2048, 1)


def test_a_new_inventory_re_attributes_existing_pods() -> None:
    ledger = ledger_with(gpu_pod("p", 30000, node=NODE, index="1"))
    resource = gpunode_resource(NODE, [81559, 40960])
    inventory = node_inventory(capacity_node(NODE, 89424, 8), resource)
    assert inventory is not None
    ledger.set_node(inventory)
    assert card(ledger, 1) == (30000, 10960, 1)


def test_release_gives_the_memory_back() -> None:
    pod = gpu_pod("p", 1024, node=NODE, index="0", uid="u-release")
    ledger = ledger_with(pod)
    released = ledger.release(PodUid("u-release"))
    assert released is not None
    assert released.cards == (0,)
    assert card(ledger, 0) == (0, 11178, 0)
    assert ledger.release(PodUid("u-release")) is None


def test_an_unreadable_request_is_reported_and_not_counted() -> None:
    pod = gpu_pod("both", 1024, number=1, node=NODE, index="0")
    claim = claim_of(pod)
    assert claim.allocation is None
    assert claim.problem is not None
    assert "both" in claim.problem


def allocation_of(pod: dict[str, object]) -> Allocation:
    claim = claim_of(pod)
    assert claim.allocation is not None
    return claim.allocation


@pytest.mark.parametrize(
    ("pod", "hint"),
    [
        (gpu_pod("ghost", 1024, node=NODE, index="9"), "names card 9, which the node does not"),
        (gpu_pod("sick", 1024, node=NODE, index="1"), "names card 1, which is unhealthy"),
        (gpu_pod("odd", 1024, node=NODE, index="a"), "no valid volcano.sh/gpu-index"),
        (gpu_pod("none", 1024, node=NODE), "no valid volcano.sh/gpu-index"),
        (gpu_pod("wide", 1024, node=NODE, index="0,2"), "names 2 cards but"),
        (gpu_pod("short", number=2, node=NODE, index="0"), "names 1 cards but"),
    ],
    ids=[
        "missing card",
        "unhealthy card",
        "malformed",
        "absent",
        "memory on two cards",
        "too few whole cards",
    ],
)
def test_allocations_the_node_cannot_serve_are_refused_with_the_fix(
    pod: dict[str, object], hint: str
) -> None:
    inventory = node_inventory(capacity_node(NODE, 89424, 8, unhealthy="1"))
    assert inventory is not None
    with pytest.raises(InvalidAnnotation) as caught:
        check_allocation(allocation_of(pod), inventory)
    assert hint in str(caught.value)
    assert "delete the pod" in str(caught.value) or "recreate it" in str(caught.value)


def test_a_served_allocation_passes_the_check() -> None:
    inventory = node_inventory(capacity_node(NODE, 89424, 8))
    assert inventory is not None
    check_allocation(allocation_of(gpu_pod("ok", 1024, node=NODE, index="0")), inventory)
    check_allocation(allocation_of(gpu_pod("w", number=2, node=NODE, index="0,5")), inventory)
