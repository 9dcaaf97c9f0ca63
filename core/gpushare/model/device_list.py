"""How a container is told its cards (NVIDIA's device-list strategies): the env Volcano's
guide documents and, as the strategy says, mounts or Container Device Interface (CDI) names
through which the container runtime gives the cards themselves."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gpushare.model import contract
from gpushare.model.inventory import Card
from gpushare.model.request import GpuKind


class VisibleDevices(StrEnum):
    """How the runtime names the cards: NVIDIA_VISIBLE_DEVICES' values, CDI device names."""

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
    the mounts, which a pod cannot set. `cdi-annotations` and `cdi-cri`: the cards are CDI
    devices (`nvidia.com/gpu=0`, as `nvidia-ctk cdi generate` and the GPU Operator name
    them), named to the runtime in a container annotation or in the CRI's CDIDevices field
    (Kubernetes 1.31+); containerd 1.7+ (enable_cdi) or 2.x, or CRI-O, applies the node's
    CDI spec. No environment variable then gives a card: NVIDIA_VISIBLE_DEVICES is `void`,
    so a legacy NVIDIA hook reading an image's `all` gives none either."""

    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    CDI_ANNOTATIONS = "cdi-annotations"
    CDI_CRI = "cdi-cri"


VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
DEFAULT_CDI_KIND = "nvidia.com/gpu"
NO_DEVICES = "void"
"""NVIDIA_VISIBLE_DEVICES that gives no card (the NVIDIA container toolkit's word)."""
_CDI_KIND = re.compile(r"^[a-z0-9][a-z0-9.-]*[a-z0-9]/[a-zA-Z0-9][a-zA-Z0-9_.-]*$")


def cdi_kind(value: str) -> str:
    """A CDI device kind (`vendor/class`, e.g. nvidia.com/gpu); ValueError naming the form."""
    if not _CDI_KIND.match(value):
        raise ValueError(
            f"{value!r} is not a CDI device kind: write vendor/class, e.g. {DEFAULT_CDI_KIND}"
        )
    return value


@dataclass(frozen=True, slots=True)
class Mount:
    """A host path the kubelet mounts into the container."""

    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class DeviceListing:
    """The plugin's settings for telling a container its cards."""

    strategy: DeviceListStrategy = DeviceListStrategy.ENVVAR
    visible: VisibleDevices = VisibleDevices.INDEX
    cdi_kind: str = DEFAULT_CDI_KIND


ENVVAR_BY_INDEX = DeviceListing()
"""The default: NVIDIA_VISIBLE_DEVICES lists the cards' indexes (Volcano's behaviour)."""


@dataclass(frozen=True, slots=True)
class Told:
    """What the kubelet passes on for one container: env, mounts, CRI annotations, CDI names."""

    env: dict[str, str]
    mounts: tuple[Mount, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


def card_names(cards: Sequence[Card], visible: VisibleDevices) -> list[str]:
    """How the container runtime is told each card: its index or its UUID."""
    if visible is VisibleDevices.UUID:
        return [card.uuid or str(card.index) for card in cards]
    return [str(card.index) for card in cards]


def tell(kind: GpuKind, allocated_mib: int, cards: Sequence[Card], listing: DeviceListing) -> Told:
    """The three variables Volcano's guide documents for this container and its cards, and
    whatever the strategy adds.

    A gpu-memory container is allocated the MiB it asked (`allocated_mib`) on its one card; a
    gpu-number container is allocated its cards whole, so both variables carry their total MiB.
    """
    total = sum(card.total_mib for card in cards)
    names = card_names(cards, listing.visible)
    visible_devices = {
        DeviceListStrategy.ENVVAR: ",".join(names),
        DeviceListStrategy.VOLUME_MOUNTS: VOLUME_MOUNTS_ROOT,
    }.get(listing.strategy, NO_DEVICES)
    env = {
        contract.ENV_VISIBLE_DEVICES: visible_devices,
        contract.ENV_GPU_ALLOCATED: str(allocated_mib if kind is GpuKind.MEMORY else total),
        contract.ENV_GPU_MEMORY_TOTAL: str(total),
    }
    if listing.strategy is DeviceListStrategy.VOLUME_MOUNTS:
        # An empty file per card, its name the card's (the NVIDIA container toolkit reads them).
        mounts = tuple(
            Mount(container_path=f"{VOLUME_MOUNTS_ROOT}/{name}", host_path="/dev/null")
            for name in names
        )
        return Told(env=env, mounts=mounts)
    devices = tuple(f"{listing.cdi_kind}={name}" for name in names)
    if listing.strategy is DeviceListStrategy.CDI_ANNOTATIONS:
        # One key per resource: the kubelet merges the annotations of a container's plugins.
        key = f"{CDI_ANNOTATION_PREFIX}gpushare_{kind.value.rsplit('/', 1)[-1]}"
        return Told(env=env, annotations={key: ",".join(devices)})
    if listing.strategy is DeviceListStrategy.CDI_CRI:
        return Told(env=env, cdi_devices=devices)
    return Told(env=env)
