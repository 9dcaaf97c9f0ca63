"""The metrics of both components follow Prometheus's naming rules, as `promtool check metrics`
lints them: base units in the name, `_total` on counters, help on every family, and a
`_build_info` with the version."""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib.metadata import version

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpushare_operator.metrics import SchedulerMetrics
from gpushare_plugin.metrics import PluginMetrics

NAME = re.compile(r"^[a-z][a-z0-9_]*$")
NOT_BASE_UNITS = re.compile(r"_(mib|kib|gib|mb|kb|ms|milliseconds|minutes|hours|percent)(_|$)")


def exposition(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def operator_registry() -> CollectorRegistry:
    return SchedulerMetrics().registry


def plugin_registry() -> CollectorRegistry:
    return PluginMetrics().registry


def node_plugin_registry() -> CollectorRegistry:
    """As the plugin serves it: every series labelled with its node."""
    return used_plugin(PluginMetrics(node="gpu-node-1")).registry


def used_plugin(metrics: PluginMetrics) -> PluginMetrics:
    """One series in every family, as a plugin that served a pod has them."""
    metrics.allocations.labels("volcano.sh/gpu-memory", "ok").inc()
    metrics.allocate_latency.labels("volcano.sh/gpu-memory").observe(0.002)
    metrics.devices.labels("volcano.sh/gpu-memory", "Healthy").set(44)
    metrics.limits_kept.labels("XLA_PYTHON_CLIENT_MEM_FRACTION").inc()
    metrics.container_used_bytes.labels("gpu-node-1", "default", "p", "c", "0").set(1.0)
    metrics.container_granted_bytes.labels("gpu-node-1", "default", "p", "c", "0").set(2.0)
    metrics.unmapped_used_bytes.labels("gpu-node-1", "0").set(3.0)
    metrics.cards.labels("0", "GPU-0").set(1)
    return metrics


REGISTRIES: dict[str, tuple[Callable[[], CollectorRegistry], str]] = {
    "operator": (operator_registry, "gpushare_"),
    "plugin": (plugin_registry, "gpushare_plugin_"),
    "plugin with its node": (node_plugin_registry, "gpushare_plugin_"),
}


@pytest.mark.parametrize("component", sorted(REGISTRIES))
def test_metric_names_follow_prometheus_conventions(component: str) -> None:
    registry, prefix = REGISTRIES[component]
    families = list(text_string_to_metric_families(exposition(registry())))
    assert families
    for family in families:
        assert NAME.match(family.name), family.name
        assert family.name.startswith(prefix), family.name
        assert not NOT_BASE_UNITS.search(family.name), f"{family.name}: use seconds or bytes"
        assert family.documentation.endswith("."), family.name
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if family.type == "histogram":
            assert family.name.endswith(("_seconds", "_bytes")), family.name
    (info,) = [f for f in families if f.name.endswith("_build_info")]
    (sample,) = info.samples
    assert sample.labels["version"] == version("kube-gpushare")
    assert sample.value == 1


def test_every_series_of_the_plugin_names_its_node_and_keeps_its_name() -> None:
    """A Service scrape's `instance` is a pod address: `node` says which node's plugin spoke.
    The names, and every other label, are what they were without it."""
    labelled = list(text_string_to_metric_families(exposition(node_plugin_registry())))
    bare = list(text_string_to_metric_families(exposition(used_plugin(PluginMetrics()).registry)))
    assert [f.name for f in labelled] == [f.name for f in bare]
    samples = [s for family in labelled for s in family.samples]
    assert len(samples) >= 8
    assert all(s.labels["node"] == "gpu-node-1" for s in samples)
    without_node = {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "node")))
        for family in labelled
        for s in family.samples
        if not s.name.endswith("_created")
    }
    assert without_node == {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "node")))
        for family in bare
        for s in family.samples
        if not s.name.endswith("_created")
    }
    allocated = node_plugin_registry().get_sample_value(
        "gpushare_plugin_allocate_total",
        {"node": "gpu-node-1", "resource": "volcano.sh/gpu-memory", "result": "ok"},
    )
    assert allocated == 1.0
