"""Where the cards come from: NVML on a GPU node, a fake spec elsewhere; one interface."""

from gpushare_plugin.discovery.base import (
    DiscoveredCard,
    Discovery,
    DiscoveryError,
    XidEvent,
)

__all__ = ["DiscoveredCard", "Discovery", "DiscoveryError", "XidEvent"]
