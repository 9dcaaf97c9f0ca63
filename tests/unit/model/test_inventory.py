"""A node's cards, from the GPUNode resource or from Volcano-style node capacity."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.model import (
    InvalidAnnotation,
    InvalidInventory,
    InvalidQuantity,
    InventorySource,
    contract,
    node_inventory,
)


def node(capacity: dict[str, Any] | None = None, unhealthy: str | None = None) -> dict[str, Any]:
    annotations = {contract.GPU_UNHEALTHY_IDS: unhealthy} if unhealthy is not None else {}
    return {
        "metadata": {"name": "gpu-1", "annotations": annotations},
        "status": {"capacity": capacity or {}},
    }


def gpunode(cards: list[dict[str, Any]], unit: object = 1) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-1"}, "spec": {"memoryUnitMiB": unit, "cards": cards}}


def card(index: int, mib: int = 81559, uuid: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": uuid or f"GPU-{index}",
        "model": "NVIDIA H100",
        "memoryMiB": mib,
        **extra,
    }


GUIDE_CAPACITY = {contract.GPU_MEMORY: "89424", contract.GPU_NUMBER: "8"}


def test_the_guides_node_has_eight_cards_of_11178_mib() -> None:
    inventory = node_inventory(node(GUIDE_CAPACITY))
    assert inventory is not None
    assert inventory.source is InventorySource.CAPACITY
    assert [c.index for c in inventory.cards] == list(range(8))
    assert {c.memory for c in inventory.cards} == {11178}
    assert all(c.healthy for c in inventory.cards)


def test_a_node_without_gpu_capacity_has_no_inventory() -> None:
    assert node_inventory(node({"cpu": "4"})) is None
    assert node_inventory(node({contract.GPU_MEMORY: "0", contract.GPU_NUMBER: "0"})) is None


def test_volcanos_number_strategy_nodes_offer_whole_cards_only() -> None:
    inventory = node_inventory(node({contract.GPU_MEMORY: "0", contract.GPU_NUMBER: "4"}))
    assert inventory is not None
    assert [c.memory for c in inventory.cards] == [0, 0, 0, 0]


def test_unhealthy_ids_mark_cards_and_ignore_cards_the_node_lacks() -> None:
    inventory = node_inventory(node(GUIDE_CAPACITY, unhealthy="1,6,9"))
    assert inventory is not None
    assert [c.index for c in inventory.cards if not c.healthy] == [1, 6]


def test_an_empty_unhealthy_annotation_marks_nothing() -> None:
    inventory = node_inventory(node(GUIDE_CAPACITY, unhealthy=""))
    assert inventory is not None
    assert all(c.healthy for c in inventory.cards)


@pytest.mark.parametrize("raw", ["a", "0,,1", " 1", "1,1", "-1", "01"])
def test_malformed_unhealthy_ids_make_the_node_unusable_not_silently_healthy(raw: str) -> None:
    with pytest.raises(InvalidAnnotation, match="node gpu-1") as caught:
        node_inventory(node(GUIDE_CAPACITY, unhealthy=raw))
    assert contract.GPU_UNHEALTHY_IDS in str(caught.value)


def test_memory_without_cards_is_refused() -> None:
    with pytest.raises(InvalidInventory, match="gpu-number=0"):
        node_inventory(node({contract.GPU_MEMORY: "1000", contract.GPU_NUMBER: "0"}))


def test_memory_not_divisible_by_the_card_count_is_refused() -> None:
    with pytest.raises(InvalidInventory, match="not divisible"):
        node_inventory(node({contract.GPU_MEMORY: "1000", contract.GPU_NUMBER: "3"}))


def test_a_capacity_of_more_cards_than_a_node_holds_is_refused_at_once() -> None:
    # 2**40 cards would be listed one by one: the operator's event loop held for good.
    with pytest.raises(InvalidInventory, match=r"volcano\.sh/gpu-number=1099511627776, more cards"):
        node_inventory(node({contract.GPU_MEMORY: str(2**40), contract.GPU_NUMBER: str(2**40)}))


def test_a_bad_capacity_quantity_names_the_node() -> None:
    with pytest.raises(InvalidQuantity, match="node gpu-1 capacity"):
        node_inventory(node({contract.GPU_MEMORY: "1.5", contract.GPU_NUMBER: "1"}))


def test_the_gpunode_resource_gives_heterogeneous_cards_their_own_size() -> None:
    resource = gpunode([card(1, 40960, model="NVIDIA A100"), card(0, 81559)])
    inventory = node_inventory(node(GUIDE_CAPACITY), resource)
    assert inventory is not None
    assert inventory.source is InventorySource.RESOURCE
    assert [(c.index, c.memory, c.uuid) for c in inventory.cards] == [
        (0, 81559, "GPU-0"),
        (1, 40960, "GPU-1"),
    ]


def test_the_resource_counts_memory_in_its_unit() -> None:
    inventory = node_inventory(node(), gpunode([card(0, 81559)], unit=10))
    assert inventory is not None
    assert (inventory.unit_mib, inventory.cards[0].memory) == (10, 8155)


def test_resource_health_and_node_annotation_both_count() -> None:
    resource = gpunode([card(0), card(1, health="Unhealthy"), card(2)])
    inventory = node_inventory(node(unhealthy="2"), resource)
    assert inventory is not None
    assert [c.healthy for c in inventory.cards] == [True, False, False]


@pytest.mark.parametrize(
    ("cards", "unit", "hint"),
    [
        ([card(0, uuid="GPU-x"), card(1, uuid="GPU-x")], 1, "GPU-x appears twice"),
        ([card(0), card(0, uuid="GPU-other")], 1, "index appears twice"),
        ([{"index": 0, "memoryMiB": 10}], 1, "uuid is missing"),
        ([card(0, mib=0)], 1, "memoryMiB 0"),
        ([card(-1)], 1, "index -1"),
        ([{**card(0), "index": "0"}], 1, "index '0'"),
        ([card(0, health="Broken")], 1, "health 'Broken'"),
        ([card(0)], 0, "memoryUnitMiB 0"),
        ([card(0)], True, "memoryUnitMiB True"),
    ],
    ids=[
        "duplicate uuid",
        "duplicate index",
        "missing uuid",
        "zero memory",
        "negative index",
        "string index",
        "unknown health",
        "zero unit",
        "bool unit",
    ],
)
def test_inconsistent_resources_are_refused(
    cards: list[dict[str, Any]], unit: object, hint: str
) -> None:
    with pytest.raises(InvalidInventory, match="GPUNode gpu-1") as caught:
        node_inventory(node(), gpunode(cards, unit=unit))
    assert hint in str(caught.value)


def test_a_resource_without_cards_means_no_gpu() -> None:
    assert node_inventory(node(GUIDE_CAPACITY), gpunode([])) is None


def test_a_gpunode_says_whether_its_plugin_identifies_pods_and_nothing_else_passes() -> None:
    cards = [{"index": 0, "uuid": "GPU-0", "memoryMiB": 1024}]
    resource = gpunode(cards)
    found = node_inventory(node(), resource)
    assert found is not None
    assert found.identifies_pods is False  # an older plugin
    resource["spec"]["identifiesPods"] = True
    found = node_inventory(node(), resource)
    assert found is not None
    assert found.identifies_pods is True
    resource["spec"]["identifiesPods"] = "yes"
    with pytest.raises(InvalidInventory, match=r"spec\.identifiesPods 'yes' must be true or false"):
        node_inventory(node(), resource)


def test_a_gpunode_says_which_scheduler_names_its_plugin_serves_and_nothing_else_passes() -> None:
    resource = gpunode([{"index": 0, "uuid": "GPU-0", "memoryMiB": 1024}])
    found = node_inventory(node(), resource)
    assert found is not None
    assert found.serves is None  # an older plugin: not checked
    resource["spec"]["schedulerNames"] = ["gpushare", "volcano"]
    found = node_inventory(node(), resource)
    assert found is not None
    assert found.serves == frozenset({"gpushare", "volcano"})
    resource["spec"]["schedulerNames"] = "volcano"
    with pytest.raises(InvalidInventory, match=r"spec\.schedulerNames 'volcano' must be a list"):
        node_inventory(node(), resource)
