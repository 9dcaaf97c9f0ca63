"""Device ids and the exact size of the ListAndWatch message the kubelet must accept."""

from __future__ import annotations

import pytest

from gpushare.model.annotations import CardIndex
from gpushare.model.devices import (
    KUBELET_MESSAGE_LIMIT,
    CardDevices,
    card_of_memory_device,
    check_unit_fits,
    memory_message_size,
    smallest_fitting_unit,
)
from gpushare.model.errors import InvalidInventory
from gpushare_plugin._proto.v1beta1 import api_pb2


def encoded_size(cards: list[CardDevices], unit: int) -> int:
    devices: list[api_pb2.Device] = []
    for card in cards:
        topology = (
            api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=card.numa_node)])
            if card.numa_node is not None
            else None
        )
        devices.extend(
            api_pb2.Device(ID=f"{card.index}-{k}", health="Unhealthy", topology=topology)
            for k in range(card.memory_mib // unit)
        )
    return api_pb2.ListAndWatchResponse(devices=devices).ByteSize()


@pytest.mark.parametrize(
    "cards",
    [
        [CardDevices(index=CardIndex(0), memory_mib=11178)],
        [CardDevices(index=CardIndex(i), memory_mib=1500 + i) for i in range(12)],
        [
            CardDevices(index=CardIndex(0), memory_mib=120, numa_node=0),
            CardDevices(index=CardIndex(1), memory_mib=99, numa_node=1),
            CardDevices(index=CardIndex(10), memory_mib=1001, numa_node=300),
        ],
    ],
)
@pytest.mark.parametrize("unit", [1, 7, 1024])
def test_the_computed_size_is_what_protobuf_encodes(cards: list[CardDevices], unit: int) -> None:
    assert memory_message_size(cards, unit) == encoded_size(cards, unit)


def test_eight_141_gib_cards_need_a_coarser_unit_and_get_the_smallest_that_fits() -> None:
    cards = [CardDevices(index=CardIndex(i), memory_mib=144384, numa_node=i // 4) for i in range(8)]
    assert memory_message_size(cards, 1) > KUBELET_MESSAGE_LIMIT
    unit = smallest_fitting_unit(cards)
    assert memory_message_size(cards, unit) <= KUBELET_MESSAGE_LIMIT
    assert memory_message_size(cards, unit - 1) > KUBELET_MESSAGE_LIMIT
    with pytest.raises(InvalidInventory, match=f"use --gpu-memory-factor={unit} or larger"):
        check_unit_fits(cards, 1)
    assert check_unit_fits(cards, unit) <= KUBELET_MESSAGE_LIMIT


def test_the_guides_node_fits_at_one_mib() -> None:
    cards = [CardDevices(index=CardIndex(i), memory_mib=11178) for i in range(8)]
    assert smallest_fitting_unit(cards) == 1


@pytest.mark.parametrize(
    ("device", "card"),
    [("0-0", 0), ("7-11177", 7), ("GPU-123", None), ("3-", None), ("-1", None), ("a-1", None)],
)
def test_memory_device_ids_name_their_card(device: str, card: int | None) -> None:
    assert card_of_memory_device(device) == card
