"""How a container is told its cards (NVIDIA's device-list strategies): the env Volcano's
guide documents and, with `volume-mounts`, one mount per card."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from gpushare.model import contract
from gpushare.model.inventory import Card
from gpushare.model.request import GpuKind


class VisibleDevices(StrEnum):
    """How NVIDIA_VISIBLE_DEVICES names the cards."""

    INDEX = "index"
    UUID = "uuid"


class DeviceListStrategy(StrEnum):
    """How the container runtime is told the cards, as NVIDIA's device plugin names it.

    `envvar`: NVIDIA_VISIBLE_DEVICES lists them. A container's own env would win over it,
    which the gpushare-gpu-env policy refuses; a variable from the image or `envFrom` is
    beyond that policy. `volume-mounts`: NVIDIA_VISIBLE_DEVICES points at
    `VOLUME_MOUNTS_ROOT`, under which one empty mount per card names it; with the NVIDIA
    container toolkit's accept-nvidia-visible-devices-as-volume-mounts = true and
    accept-nvidia-visible-devices-envvar-when-unprivileged = false, the runtime reads only
    the mounts, which a pod cannot set."""

    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"


VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"


@dataclass(frozen=True, slots=True)
class Mount:
    """A host path the kubelet mounts into the container."""

    container_path: str
    host_path: str
    read_only: bool = True


def card_names(cards: Sequence[Card], visible: VisibleDevices) -> list[str]:
    """How the container runtime is told each card: its index or its UUID."""
    if visible is VisibleDevices.UUID:
        return [card.uuid or str(card.index) for card in cards]
    return [str(card.index) for card in cards]


def container_env(
    kind: GpuKind,
    allocated_mib: int,
    cards: Sequence[Card],
    visible: VisibleDevices = VisibleDevices.INDEX,
    strategy: DeviceListStrategy = DeviceListStrategy.ENVVAR,
) -> dict[str, str]:
    """The three variables Volcano's guide documents, for this container and its cards.

    A gpu-memory container is allocated the MiB it asked (`allocated_mib`) on its one card; a
    gpu-number container is allocated its cards whole, so both variables carry their total MiB.
    With `volume-mounts`, NVIDIA_VISIBLE_DEVICES names the folder of the mounts instead.
    """
    total = sum(card.total_mib for card in cards)
    allocated = allocated_mib if kind is GpuKind.MEMORY else total
    visible_devices = (
        VOLUME_MOUNTS_ROOT
        if strategy is DeviceListStrategy.VOLUME_MOUNTS
        else ",".join(card_names(cards, visible))
    )
    return {
        contract.ENV_VISIBLE_DEVICES: visible_devices,
        contract.ENV_GPU_ALLOCATED: str(allocated),
        contract.ENV_GPU_MEMORY_TOTAL: str(total),
    }


def device_mounts(
    cards: Sequence[Card], visible: VisibleDevices, strategy: DeviceListStrategy
) -> tuple[Mount, ...]:
    """`volume-mounts`: an empty file per card under `VOLUME_MOUNTS_ROOT`, its name the card's
    (the NVIDIA container toolkit reads the names); none for `envvar`."""
    if strategy is not DeviceListStrategy.VOLUME_MOUNTS:
        return ()
    return tuple(
        Mount(container_path=f"{VOLUME_MOUNTS_ROOT}/{name}", host_path="/dev/null")
        for name in card_names(cards, visible)
    )
