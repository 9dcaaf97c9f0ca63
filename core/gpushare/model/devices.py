"""The devices the plugin advertises to the kubelet, and the size of the message that lists them.

`volcano.sh/gpu-memory` has one device per memory unit per card, ids ``"<card>-<k>"`` (as
Volcano's plugin names them); `volcano.sh/gpu-number` has one device per card, id the card's
UUID, so the kubelet's records (pod-resources API) name real GPUs.

The kubelet reads ListAndWatch with gRPC's default 4 MiB receive limit: a larger message is
dropped and the node shows no GPU memory at all (volcano-sh/devices#18). The size is computed
here exactly, byte for byte as protobuf encodes it, for the worst case of every device
Unhealthy (a health change re-sends the whole list), so the unit can be chosen before serving.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gpushare.model import contract
from gpushare.model.annotations import CardIndex
from gpushare.model.errors import InvalidInventory

KUBELET_MESSAGE_LIMIT = 4 * 1024 * 1024
"""gRPC's default maximum receive size, which the kubelet's device-plugin client keeps."""

MAX_UNIT_MIB = 1024 * 1024
"""Upper bound of the auto unit search: 1 TiB per device is past any card."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CardDevices:
    """What the message size depends on: a card's index, its units and its NUMA node."""

    index: CardIndex
    memory_mib: int
    numa_node: int | None = None


def memory_device_id(card: CardIndex, k: int) -> str:
    return f"{card}-{k}"


def memory_device_ids(card: CardIndex, units: int) -> Iterator[str]:
    prefix = f"{card}-"
    return (f"{prefix}{k}" for k in range(units))


def card_of_memory_device(device_id: str) -> CardIndex | None:
    """The card of a gpu-memory device id ``"<card>-<k>"``, None for any other id."""
    card, dash, unit = device_id.partition("-")
    if not dash or not card.isdigit() or not unit.isdigit():
        return None
    return CardIndex(int(card))


def units_of(memory_mib: int, unit_mib: int) -> int:
    """Whole units of `unit_mib` MiB in a card; a remainder is not advertised."""
    return memory_mib // unit_mib


def _varint_size(value: int) -> int:
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


def _field_size(payload: int) -> int:
    """A length-delimited field: one tag byte, the length varint, the payload."""
    return 1 + _varint_size(payload) + payload


def _topology_size(numa_node: int | None) -> int:
    if numa_node is None:
        return 0
    numa = 0 if numa_node == 0 else 1 + _varint_size(numa_node)  # proto3 omits a zero ID
    return _field_size(_field_size(numa))  # TopologyInfo{nodes: [NUMANode{ID}]}


def memory_message_size(cards: Sequence[CardDevices], unit_mib: int) -> int:
    """Exact bytes of the gpu-memory ListAndWatchResponse with every device Unhealthy."""
    health = _field_size(len(contract.UNHEALTHY))
    total = 0
    for card in cards:
        units = units_of(card.memory_mib, unit_mib)
        if units == 0:
            continue
        prefix = len(str(card.index)) + 1
        fixed = health + _topology_size(card.numa_node)
        # Ids of equal digit count encode to devices of equal size: group by digit count.
        low, width = 0, 1
        while low < units:
            high = min(units, 10**width)
            device = _field_size(prefix + width) + fixed
            total += (high - low) * _field_size(device)
            low, width = high, width + 1
    return total


def smallest_fitting_unit(cards: Sequence[CardDevices], limit: int = KUBELET_MESSAGE_LIMIT) -> int:
    """The smallest unit (MiB per device) whose gpu-memory message fits in `limit` bytes."""
    if memory_message_size(cards, 1) <= limit:
        return 1
    low, high = 1, MAX_UNIT_MIB  # size(low) > limit >= size(high); size falls as unit grows
    if memory_message_size(cards, high) > limit:
        raise InvalidInventory(
            f"{len(cards)} cards cannot be listed within {limit} bytes at any unit"
        )
    while high - low > 1:
        middle = (low + high) // 2
        if memory_message_size(cards, middle) <= limit:
            high = middle
        else:
            low = middle
    return high


def check_unit_fits(
    cards: Sequence[CardDevices], unit_mib: int, limit: int = KUBELET_MESSAGE_LIMIT
) -> int:
    """The message size at `unit_mib`; InvalidInventory naming the smallest unit that fits
    when it is over the kubelet's limit."""
    size = memory_message_size(cards, unit_mib)
    if size > limit:
        fitting = smallest_fitting_unit(cards, limit)
        raise InvalidInventory(
            f"at --gpu-memory-factor={unit_mib} the {contract.GPU_MEMORY} device list of "
            f"{len(cards)} cards is {size} bytes, over the kubelet's {limit}-byte message "
            f"limit (the node would show no GPU memory); use --gpu-memory-factor={fitting} "
            f"or larger, or --gpu-memory-factor=auto, and write pod limits in that unit"
        )
    return size
