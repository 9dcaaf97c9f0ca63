"""Where the cards come from: NVML on a GPU node, a fake spec elsewhere; one interface."""

from gpushare_plugin.discovery.base import (
    CardProcess,
    DiscoveredCard,
    Discovery,
    DiscoveryError,
    Processes,
    XidEvent,
)

__all__ = [
    "CardProcess",
    "DiscoveredCard",
    "Discovery",
    "DiscoveryError",
    "Processes",
    "XidEvent",
]
