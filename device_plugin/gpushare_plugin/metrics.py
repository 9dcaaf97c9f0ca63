"""Prometheus metrics of the device plugin (served by prometheus_client on its own thread)."""

from __future__ import annotations

import platform
from importlib.metadata import version

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        Info("gpushare_plugin_build", "The device plugin's version.", registry=self.registry).info(
            {"version": version("kube-gpushare"), "python": platform.python_version()}
        )
        self.allocations = Counter(
            "gpushare_plugin_allocate_total",
            "Allocate calls by resource and result (ok, no_candidate, error).",
            ["resource", "result"],
            registry=self.registry,
        )
        self.allocate_latency = Histogram(
            "gpushare_plugin_allocate_seconds",
            "Time to answer an Allocate call, by resource.",
            ["resource"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1, 5),
            registry=self.registry,
        )
        self.devices = Gauge(
            "gpushare_plugin_devices",
            "Devices advertised to the kubelet, by resource and health.",
            ["resource", "health"],
            registry=self.registry,
        )
        self.limits_kept = Counter(
            "gpushare_plugin_framework_limit_kept_own_total",
            "Containers that set a framework's memory variable themselves (theirs wins), by "
            "variable.",
            ["variable"],
            registry=self.registry,
        )
        measured = ["node", "namespace", "pod", "container", "card"]
        self.container_used_bytes = Gauge(
            "gpushare_plugin_container_gpu_memory_used_bytes",
            "GPU memory a container's processes hold on a card (NVML, contexts included).",
            measured,
            registry=self.registry,
        )
        self.container_granted_bytes = Gauge(
            "gpushare_plugin_container_gpu_memory_granted_bytes",
            "GPU memory a container was granted on a card (0 on a card it was not given).",
            measured,
            registry=self.registry,
        )
        self.unmapped_used_bytes = Gauge(
            "gpushare_plugin_unmapped_gpu_memory_used_bytes",
            "GPU memory held on a card by processes of no known container.",
            ["node", "card"],
            registry=self.registry,
        )
        self.cards = Gauge(
            "gpushare_plugin_card_healthy",
            "1 while a card is Healthy, 0 while it is Unhealthy.",
            ["card", "uuid"],
            registry=self.registry,
        )

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)
