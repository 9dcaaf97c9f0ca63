"""Choosing node and card: the four policies, whole cards, and the reasons when nothing fits."""

from __future__ import annotations

import pytest
from builders import capacity_node, gpu_pod, gpunode_resource

from gpushare.model import (
    CardIndex,
    Diagnosis,
    GpuKind,
    InvalidRequest,
    Ledger,
    NodeName,
    NodeProblem,
    Placement,
    PodRequest,
    Policy,
    claim_of,
    node_inventory,
    place,
    pod_ref,
)


def memory(units: int) -> PodRequest:
    return PodRequest(kind=GpuKind.MEMORY, total=units, containers=())


def cards(count: int) -> PodRequest:
    return PodRequest(kind=GpuKind.NUMBER, total=count, containers=())


def cluster(nodes: dict[str, list[int]], *pods: dict[str, object]) -> Ledger:
    """Nodes with heterogeneous cards (MiB per card), and the pods already on them."""
    ledger = Ledger()
    for name, sizes in nodes.items():
        inventory = node_inventory(capacity_node(name, 0, 0), gpunode_resource(name, sizes))
        assert inventory is not None
        ledger.set_node(inventory)
    for pod in pods:
        claim = claim_of(pod)
        assert claim.allocation is not None
        ledger.add(claim.allocation)
    return ledger


def placed(result: Placement | Diagnosis) -> tuple[str, tuple[int, ...]]:
    assert isinstance(result, Placement), result.summary() if isinstance(result, Diagnosis) else ""
    return result.node, result.cards


def test_the_guides_two_pods_land_on_card_zero_of_an_empty_node() -> None:
    ledger = Ledger()
    inventory = node_inventory(capacity_node("gpu-1", 89424, 8))
    assert inventory is not None
    ledger.set_node(inventory)
    for name in ("gpu-pod1", "gpu-pod2"):
        result = place(ledger, memory(1024))
        assert placed(result) == ("gpu-1", (0,))
        assert isinstance(result, Placement)
        ledger.add(result.allocation(pod_ref(gpu_pod(name, 1024))))
    usage = ledger.node(NodeName("gpu-1"))
    assert usage is not None
    assert usage.cards[0].used == 2048  # type: ignore[index]


def test_bestfit_picks_the_card_left_tightest_across_nodes() -> None:
    ledger = cluster(
        {"a": [81559, 40960], "b": [24576, 16384]},
        gpu_pod("x", 20000, node="a", index="1"),  # a/1 has 20960 free
    )
    result = place(ledger, memory(16000))
    assert placed(result) == ("b", (1,))
    assert isinstance(result, Placement)
    assert result.free_after == 384


def test_firstfit_reproduces_volcano_lowest_index_on_the_first_node() -> None:
    ledger = cluster({"a": [81559, 40960], "b": [24576, 16384]})
    assert placed(place(ledger, memory(16000), Policy.FIRSTFIT)) == ("a", (0,))


def test_binpack_fills_the_fullest_node_first() -> None:
    ledger = cluster(
        {"a": [40960, 40960], "b": [40960, 40960]},
        gpu_pod("x", 30000, node="b", index="0"),
    )
    # b is fuller; its tightest fitting card is 0 (10960 free).
    assert placed(place(ledger, memory(8000), Policy.BINPACK)) == ("b", (0,))


def test_spread_picks_the_emptiest_node_and_card() -> None:
    ledger = cluster(
        {"a": [40960, 40960], "b": [40960, 40960]},
        gpu_pod("x", 30000, node="a", index="0"),
    )
    assert placed(place(ledger, memory(8000), Policy.SPREAD)) == ("b", (0,))


def test_ties_break_on_node_name_then_card_index() -> None:
    ledger = cluster({"b": [1000, 1000], "a": [1000, 1000]})
    for policy in Policy:
        assert placed(place(ledger, memory(500), policy)) == ("a", (0,)), policy


def test_whole_cards_take_idle_cards_and_never_a_card_in_use() -> None:
    ledger = cluster({"a": [16384] * 4}, gpu_pod("share", 1024, node="a", index="0"))
    assert placed(place(ledger, cards(2))) == ("a", (1, 2))
    result = place(ledger, cards(4))
    assert isinstance(result, Diagnosis)
    assert "card 0 in use" in result.summary()


def test_memory_pods_never_share_a_card_held_whole() -> None:
    ledger = cluster({"a": [16384, 16384]}, gpu_pod("whole", number=1, node="a", index="0"))
    assert placed(place(ledger, memory(1000))) == ("a", (1,))


def test_bestfit_whole_cards_come_from_the_node_with_fewest_idle_cards() -> None:
    ledger = cluster(
        {"a": [16384] * 4, "b": [16384] * 4},
        gpu_pod("w", number=2, node="b", index="0,1"),
    )
    assert placed(place(ledger, cards(2))) == ("b", (2, 3))
    assert placed(place(ledger, cards(2), Policy.SPREAD)) == ("a", (0, 1))


def test_bestfit_whole_cards_prefer_the_smallest_cards() -> None:
    ledger = cluster({"a": [81559, 16384, 81559, 16384]})
    assert placed(place(ledger, cards(2))) == ("a", (1, 3))


def test_unhealthy_cards_are_skipped_with_the_reason() -> None:
    ledger = Ledger()
    inventory = node_inventory(capacity_node("gpu-1", 22356, 2, unhealthy="0"))
    assert inventory is not None
    ledger.set_node(inventory)
    assert placed(place(ledger, memory(1024))) == ("gpu-1", (1,))
    result = place(ledger, memory(12000))
    assert isinstance(result, Diagnosis)
    assert result.summary() == (
        "0/1 nodes are available: 1 no card with enough free GPU memory. "
        "gpu-1: card 0 unhealthy, card 1 11178 MiB free < 12000 MiB"
    )


def test_the_issue_example_reads_like_a_scheduler_message() -> None:
    ledger = cluster({"node-a": [1536, 4096]}, gpu_pod("x", 1024, node="node-a", index="0"))
    inventory = node_inventory(
        capacity_node("node-a", 0, 0), gpunode_resource("node-a", [1536, 4096], unhealthy=(1,))
    )
    assert inventory is not None
    ledger.set_node(inventory)
    ledger.set_node_without_gpu(NodeName("node-b"))
    result = place(ledger, memory(1024))
    assert isinstance(result, Diagnosis)
    assert result.summary() == (
        "0/2 nodes are available: 1 no GPU, 1 no card with enough free GPU memory. "
        "node-a: card 0 512 MiB free < 1024 MiB, card 1 unhealthy; node-b: no GPU"
    )


def test_other_filters_are_asked_and_their_reasons_shown() -> None:
    ledger = cluster({"a": [16384], "b": [16384]})
    asked: list[str] = []

    def only_b(node: NodeName) -> str | None:
        asked.append(node)
        return None if node == "b" else "node is cordoned"

    assert placed(place(ledger, memory(1000), node_check=only_b)) == ("b", (0,))
    result = place(ledger, memory(1000), node_check=lambda node: "node is not ready")
    assert isinstance(result, Diagnosis)
    assert result.summary().startswith("0/2 nodes are available: 2 node is not ready.")


def test_memory_held_without_a_card_keeps_the_node_from_overcommitting() -> None:
    ledger = cluster({"a": [16384]}, gpu_pod("foreign", 16000, node="a"))
    result = place(ledger, memory(1000))
    assert isinstance(result, Diagnosis)
    assert result.nodes[0].problem is NodeProblem.NODE_TOTAL
    assert "held by pods without a valid gpu-index" in result.summary()


def test_invalid_inventories_are_listed_with_their_error() -> None:
    ledger = cluster({"a": [1000]})
    ledger.set_node_without_gpu(NodeName("broken"), "node broken: capacity not divisible")
    result = place(ledger, memory(2000))
    assert isinstance(result, Diagnosis)
    assert "broken: node broken: capacity not divisible" in result.summary()


def test_long_messages_are_capped_and_say_how_many_nodes_were_left_out() -> None:
    ledger = cluster({f"node-{i:04d}": [1000] * 8 for i in range(200)})
    message = place(ledger, memory(2000)).summary()  # type: ignore[union-attr]
    assert len(message) <= 1024
    assert message.startswith("0/200 nodes are available: 200 no card with enough free")
    assert message.endswith("more nodes")
    assert "cards 0-7 1000 MiB free < 2000 MiB" in message


def test_placement_is_only_for_gpu_requests() -> None:
    with pytest.raises(InvalidRequest):
        place(Ledger(), PodRequest(kind=None, total=0, containers=()))


def test_a_card_check_steers_the_pod_to_the_card_it_allows() -> None:
    ledger = cluster({"a": [16384, 16384]})

    def only_card_1(node: NodeName, card: CardIndex) -> str | None:
        return None if card == 1 else "reserved for an earlier pod of the same size"

    assert placed(place(ledger, memory(1000), card_check=only_card_1)) == ("a", (1,))
    assert placed(place(ledger, cards(1), card_check=only_card_1)) == ("a", (1,))
    for policy in Policy:
        assert placed(place(ledger, memory(1000), policy, card_check=only_card_1)) == ("a", (1,))


def test_cards_held_back_by_the_card_check_are_explained() -> None:
    ledger = cluster({"a": [16384]})
    result = place(ledger, memory(1000), card_check=lambda node, card: "waiting for d/p1")
    assert isinstance(result, Diagnosis)
    assert result.summary().endswith("a: card 0 waiting for d/p1")
    whole = place(ledger, cards(1), card_check=lambda node, card: "waiting for d/p1")
    assert isinstance(whole, Diagnosis)
    assert "card 0 waiting for d/p1" in whole.summary()
