"""Prometheus metrics of the device plugin (served by prometheus_client on its own thread).

Given the node's name, every series carries it as the label `node` (the plugin runs one per
node, and a Service scrape's `instance` is a pod address): prometheus_client has no constant
labels, so the metrics live in a registry of their own and `_NodeLabel` adds the label as it
collects them. The metric names and their other labels stay as they were.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from importlib.metadata import version

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

NODE_LABEL = "node"


class PluginMetrics:
    def __init__(
        self, registry: CollectorRegistry | None = None, *, node: str | None = None
    ) -> None:
        """`registry` is what is served (a new one by default); with `node`, every series
        there carries `node="<node>"`."""
        self.registry = registry or CollectorRegistry()
        own = self.registry
        if node is not None:
            own = CollectorRegistry(auto_describe=True)
            self.registry.register(_NodeLabel(own, node))
        self._own = own
        Info("gpushare_plugin_build", "The device plugin's version.", registry=own).info(
            {"version": version("kube-gpushare"), "python": platform.python_version()}
        )
        self.allocations = Counter(
            "gpushare_plugin_allocate_total",
            "Allocate calls by resource and result (ok, no_candidate, error).",
            ["resource", "result"],
            registry=own,
        )
        self.allocate_latency = Histogram(
            "gpushare_plugin_allocate_seconds",
            "Time to answer an Allocate call, by resource.",
            ["resource"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1, 5),
            registry=own,
        )
        self.devices = Gauge(
            "gpushare_plugin_devices",
            "Devices advertised to the kubelet, by resource and health.",
            ["resource", "health"],
            registry=own,
        )
        self.limits_kept = Counter(
            "gpushare_plugin_framework_limit_kept_own_total",
            "Containers that set a framework's memory variable themselves (theirs wins), by "
            "variable.",
            ["variable"],
            registry=own,
        )
        measured = ["node", "namespace", "pod", "container", "card"]
        self.container_used_bytes = Gauge(
            "gpushare_plugin_container_gpu_memory_used_bytes",
            "GPU memory a container's processes hold on a card (NVML, contexts included).",
            measured,
            registry=own,
        )
        self.container_granted_bytes = Gauge(
            "gpushare_plugin_container_gpu_memory_granted_bytes",
            "GPU memory a container was granted on a card (0 on a card it was not given).",
            measured,
            registry=own,
        )
        self.unmapped_used_bytes = Gauge(
            "gpushare_plugin_unmapped_gpu_memory_used_bytes",
            "GPU memory held on a card by processes of no known container.",
            ["node", "card"],
            registry=own,
        )
        self.cards = Gauge(
            "gpushare_plugin_card_healthy",
            "1 while a card is Healthy, 0 while it is Unhealthy.",
            ["card", "uuid"],
            registry=own,
        )

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)


class _NodeLabel(Collector):
    """The families of `inner`, each sample with `node` added (kept where a family has its
    own `node` label already: the per-container gauges name the node themselves)."""

    def __init__(self, inner: CollectorRegistry, node: str) -> None:
        self._inner = inner
        self._node = node

    def collect(self) -> Iterable[Metric]:
        for family in self._inner.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            labelled.samples = [
                sample
                if NODE_LABEL in sample.labels
                else sample._replace(labels={NODE_LABEL: self._node, **sample.labels})
                for sample in family.samples
            ]
            yield labelled
