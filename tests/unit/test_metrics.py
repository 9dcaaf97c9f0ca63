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


REGISTRIES: dict[str, tuple[Callable[[], CollectorRegistry], str]] = {
    "operator": (operator_registry, "gpushare_"),
    "plugin": (plugin_registry, "gpushare_plugin_"),
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
