"""The one interface every discovery backend implements.

Calls are synchronous (NVML is a C library): the plugin runs them in a worker thread
(`asyncio.to_thread`), never on the event loop, and `wait_event` always returns within its
timeout so a stop is honoured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gpushare.model.annotations import CardIndex


class DiscoveryError(Exception):
    """The cards cannot be read; the message names the cause and the fix."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DiscoveredCard:
    index: CardIndex
    """NVML's enumeration index, the number `gpu-index` and NVIDIA_VISIBLE_DEVICES use."""
    uuid: str
    model: str
    memory_mib: int
    numa_node: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class XidEvent:
    """A critical XID error; `uuid` None when the driver could not say which card."""

    uuid: str | None
    xid: int


@dataclass(frozen=True, kw_only=True, slots=True)
class CardProcess:
    """A process that holds memory on a card, as the driver counts it (its CUDA context
    included): its pid in the node's (the host's) pid namespace."""

    pid: int
    card: CardIndex
    used_mib: int | None
    """None where the driver cannot say (some virtualised GPUs)."""


@dataclass(frozen=True, slots=True)
class Processes:
    """Every process on the cards that answered, and why the others did not."""

    found: list[CardProcess]
    problems: list[str]


class Discovery(Protocol):
    def cards(self) -> list[DiscoveredCard]:
        """Every card on the node, by index."""
        ...

    def wait_event(self, timeout_ms: int) -> XidEvent | None:
        """The next critical XID, or None when `timeout_ms` passes without one."""
        ...

    def probe(self, uuid: str) -> bool:
        """Whether the card answers the driver normally again (the recovery check)."""
        ...

    def processes(self) -> Processes:
        """The processes holding memory on each card now (compute, graphics, MPS clients);
        DiscoveryError when not one card can say (nothing measured is not nothing used)."""
        ...

    def close(self) -> None: ...
