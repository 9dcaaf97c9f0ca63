"""Flags with environment twins: precedence, defaults and refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpushare.model import contract
from gpushare.model.device_list import VisibleDevices
from gpushare.model.limits import Framework
from gpushare_plugin.config import DEFAULT_SOCKET_DIR, ConfigError, load, parser


def flags(*argv: str) -> dict[str, str | None]:
    """The flags as the plugin's parser reads them from its command line."""
    return vars(parser().parse_args(list(argv)))


def test_defaults_need_only_the_node_name() -> None:
    config = load({}, {"NODE_NAME": "gpu-node-1"})
    assert config.node_name == "gpu-node-1"
    assert config.socket_dir == DEFAULT_SOCKET_DIR
    assert config.gpu_memory_factor == contract.DEFAULT_MEMORY_UNIT_MIB
    assert config.visible_devices is VisibleDevices.INDEX
    assert config.kubeconfig is None
    assert config.metrics_port == 9402
    assert config.health.enabled
    assert config.health.recovery_s == 300
    assert config.limits.frameworks == {Framework.JAX, Framework.TENSORFLOW}


def test_a_flag_wins_over_its_variable() -> None:
    env = {"NODE_NAME": "a", "GPU_MEMORY_FACTOR": "4", "GPUSHARE_VISIBLE_DEVICES": "uuid"}
    config = load(flags("--node-name", "b", "--gpu-memory-factor", "auto"), env)
    assert config.node_name == "b"
    assert config.gpu_memory_factor is None  # auto
    assert config.visible_devices is VisibleDevices.UUID
    assert load({}, env).gpu_memory_factor == 4


def test_every_problem_is_reported_at_once() -> None:
    env = {
        "GPU_MEMORY_FACTOR": "0",
        "GPUSHARE_VISIBLE_DEVICES": "name",
        "GPUSHARE_METRICS_PORT": "http",
        "DP_DISABLE_HEALTHCHECKS": "sometimes",
        "GPUSHARE_SOCKET_DIR": "/" + "d" * 100,
        "GPUSHARE_CDI_KIND": "gpu",
        "GPUSHARE_FRAMEWORK_LIMITS": "pytorch,mxnet",
    }
    with pytest.raises(ConfigError) as refused:
        load({}, env)
    message = str(refused.value)
    for part in (
        "NODE_NAME is required",
        "GPU_MEMORY_FACTOR='0'",
        "GPUSHARE_VISIBLE_DEVICES='name'",
        "GPUSHARE_METRICS_PORT='http'",
        "'sometimes'",
        "too long",
        "'gpu' is not a CDI device kind: write vendor/class",
        "GPUSHARE_FRAMEWORK_LIMITS='pytorch,mxnet': gpushare gives no framework named mxnet",
    ):
        assert part in message


@pytest.mark.parametrize(
    ("variable", "raw", "told"),
    [
        (
            "GPUSHARE_HEARTBEAT_SECONDS",
            "inf",
            "must be a number of seconds above 0 and at most 86400",
        ),
        (
            "GPUSHARE_ALLOCATE_WAIT_SECONDS",
            "inf",
            "must be a number of seconds from 0 (no wait) to 86400",
        ),
        ("GPUSHARE_HEALTH_RECOVERY_SECONDS", "1e6", "must be a number of seconds from 0 to 86400"),
        (
            "GPUSHARE_USAGE_INTERVAL_SECONDS",
            "1e-9",
            "must be a number of seconds from 0.1 to 86400",
        ),
        (
            "GPU_MEMORY_FACTOR",
            "1048577",
            "must be a whole number of MiB from 1 to 1048576, or auto",
        ),
        ("GPUSHARE_SOCKET_DIR", "", "must not be empty"),
        ("GPUSHARE_PROC_ROOT", " ", "must not be empty"),
    ],
)
def test_a_value_out_of_its_range_is_refused_naming_the_range(
    variable: str, raw: str, told: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load({}, {"NODE_NAME": "n", variable: raw})
    assert str(refused.value) == f"{variable}={raw!r}: {told}"


@pytest.mark.parametrize(
    ("raw", "frameworks"),
    [
        ("pytorch,jax,tensorflow", set(Framework)),
        ("all", set(Framework)),
        ("true", set(Framework)),  # its value before it named frameworks
        ("none", set()),
        ("false", set()),
        ("yes", set(Framework)),
        ("0", set()),
    ],
)
def test_an_admin_names_the_frameworks_given_limits_on_a_node(
    raw: str, frameworks: set[Framework]
) -> None:
    config = load(flags("--framework-limits", raw), {"NODE_NAME": "a"})
    assert config.limits.frameworks == frameworks


def test_the_kubeconfig_comes_from_its_variable() -> None:
    config = load({}, {"NODE_NAME": "n", "KUBECONFIG": "/etc/kube/config"})
    assert config.kubeconfig == Path("/etc/kube/config")


def test_the_help_names_each_variable_and_default() -> None:
    shown = " ".join(parser().format_help().split())
    assert "($GPU_MEMORY_FACTOR; default 512)" in shown
    assert "($GPUSHARE_SOCKET_DIR; default /var/lib/kubelet/device-plugins)" in shown
    assert "($NODE_NAME)" in shown


def test_the_health_options_make_one_policy() -> None:
    env = {
        "NODE_NAME": "n",
        "DP_DISABLE_HEALTHCHECKS": "xids",
        "GPUSHARE_HEALTH_RECOVERY_SECONDS": "7",
    }
    config = load(flags("--allocate-wait-seconds", "0"), env)
    assert not config.health.enabled
    assert config.health.recovery_s == 7
    assert config.allocate_wait_s == 0
