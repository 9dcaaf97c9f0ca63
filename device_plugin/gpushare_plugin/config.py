"""The device plugin's configuration: flags, each with an environment-variable twin.

A flag wins over its variable, the variable over the default. Every problem is reported
together, with the fix. Each option is declared once, in `OPTIONS`; `gpushare-device-plugin
--help` lists them with their variables and defaults.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpushare import options
from gpushare.model import contract
from gpushare.model.device_list import (
    DEFAULT_CDI_KIND,
    DeviceListing,
    DeviceListStrategy,
    VisibleDevices,
    cdi_kind,
)
from gpushare.model.limits import (
    DEFAULT_CONTEXT_MIB,
    DEFAULT_FRAMEWORKS,
    Framework,
    LimitSettings,
    frameworks_named,
)
from gpushare.options import Option
from gpushare_plugin.health import HealthPolicy

DEFAULT_SOCKET_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
AUTO = "auto"
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the terminating NUL


class ConfigError(ValueError):
    """Invalid flags or variables; the message lists each with its fix."""


@dataclass(frozen=True, kw_only=True)
class PluginConfig:
    node_name: str
    kubeconfig: Path | None = None
    socket_dir: Path = DEFAULT_SOCKET_DIR
    gpu_memory_factor: int | None = contract.DEFAULT_MEMORY_UNIT_MIB
    """MiB per gpu-memory device; None for `auto` (the smallest that fits the kubelet)."""
    visible_devices: VisibleDevices = VisibleDevices.INDEX
    device_list_strategy: DeviceListStrategy = DeviceListStrategy.ENVVAR
    cdi_kind: str = DEFAULT_CDI_KIND
    fake_gpus: str | None = None
    metrics_port: int = 9402
    health: HealthPolicy = field(default_factory=HealthPolicy)
    allocate_wait_s: float = 5.0
    heartbeat_s: float = 30.0
    """How often the GPUNode's heartbeat annotation is renewed."""
    scheduler_names: frozenset[str] = frozenset({contract.DEFAULT_SCHEDULER_NAME})
    """Only pods of these schedulers (the operator's) are served."""
    log_level: str = "info"
    framework_limits: frozenset[Framework] = DEFAULT_FRAMEWORKS
    """The frameworks whose limits containers that share a card get, unless their pod names
    its own (`gpushare.model.limits`)."""
    cuda_context_mib: int = DEFAULT_CONTEXT_MIB
    mps: bool = False
    usage_interval_s: float = 5.0
    """How often the processes on the cards are measured and mapped to containers."""
    proc_root: Path = Path("/proc")
    """Where the processes of the node are seen (the DaemonSet runs with hostPID)."""
    pod_resources_socket: Path | None = DEFAULT_POD_RESOURCES_SOCKET
    """The kubelet's pod-resources API, asked whether the pod served took its grant; None:
    not asked."""

    @property
    def limits(self) -> LimitSettings:
        return LimitSettings(
            frameworks=self.framework_limits, context_mib=self.cuda_context_mib, mps=self.mps
        )

    @property
    def listing(self) -> DeviceListing:
        return DeviceListing(
            strategy=self.device_list_strategy, visible=self.visible_devices, cdi_kind=self.cdi_kind
        )


def _node_name(raw: str) -> str:
    if not raw:
        raise ValueError("NODE_NAME is required: set it from the downward API (spec.nodeName)")
    return raw


def _frameworks(raw: str) -> frozenset[Framework]:
    """`--framework-limits`: a comma list, all or none; its values from before it named
    frameworks (true, false, 1, 0, yes, no) mean all and none."""
    try:
        legacy = options.boolean(raw.strip())
    except ValueError:
        return frameworks_named(raw)
    return frozenset(Framework) if legacy else frozenset()


def _path_or_none(raw: str) -> Path | None:
    return Path(raw) if raw else None


def _text_or_none(raw: str) -> str | None:
    return raw or None


def _path(raw: str) -> Path:
    return Path(options.nonblank(raw))  # Path("") would be the working folder


def _socket_dir(raw: str) -> Path:
    folder = _path(raw)
    longest = folder / "volcano-gpu-memory.sock"
    size = len(str(longest).encode())
    if size > _SOCKET_PATH_MAX:
        raise ValueError(
            f"is too long: a unix socket path has at most {_SOCKET_PATH_MAX} bytes and "
            f"{longest} has {size}"
        )
    return folder


def _factor(raw: str) -> int | None:
    if raw.strip().lower() == AUTO:
        return None
    try:
        return options.memory_unit(raw)
    except ValueError as error:
        raise ValueError(f"{error}, or {AUTO}") from None


def _mib(raw: str) -> int:
    return options.bounded(raw, int, low=0, high=65536, must="must be MiB from 0 to 65536")


_USAGE_INTERVAL_MIN_S = 0.1
"""A measurement asks NVML about every card and reads /proc: more often only burns CPU."""


# The health options have no PluginConfig field of their own: together they make `health`.
_HEALTH_CHECKS, _HEALTH_RECOVERY = "disable_healthchecks", "health_recovery_s"

OPTIONS = (
    Option(
        field="node_name",
        env="NODE_NAME",
        flag="--node-name",
        parse=_node_name,
        help="this node (required; the downward API's spec.nodeName)",
    ),
    Option(
        field="kubeconfig",
        env="KUBECONFIG",
        flag="--kubeconfig",
        parse=_path_or_none,
        help="kubeconfig file; unset: the in-cluster service account",
    ),
    Option(
        field="socket_dir",
        env="GPUSHARE_SOCKET_DIR",
        flag="--socket-dir",
        parse=_socket_dir,
        help="the kubelet's device-plugin folder",
    ),
    Option(
        field="gpu_memory_factor",
        env="GPU_MEMORY_FACTOR",
        flag="--gpu-memory-factor",
        parse=_factor,
        help="MiB per gpu-memory device: the cluster's unit (GPUShareConfig spec.memoryUnitMiB), "
        f"or {AUTO} (the smallest that fits the kubelet; for pods that write units)",
    ),
    Option(
        field="visible_devices",
        env="GPUSHARE_VISIBLE_DEVICES",
        flag="--visible-devices",
        parse=options.one_of(VisibleDevices),
        help="how NVIDIA_VISIBLE_DEVICES and CDI device names name the cards: "
        f"{' or '.join(VisibleDevices)}",
    ),
    Option(
        field="device_list_strategy",
        env="DEVICE_LIST_STRATEGY",
        flag="--device-list-strategy",
        parse=options.one_of(DeviceListStrategy),
        help="how the container runtime is told the cards, as NVIDIA's plugin names it: "
        f"{' or '.join(DeviceListStrategy)} (docs/reference.md)",
    ),
    Option(
        field="cdi_kind",
        env="GPUSHARE_CDI_KIND",
        flag="--cdi-kind",
        parse=cdi_kind,
        help="the CDI kind of the cards' devices in the node's CDI spec (cdi-annotations, cdi-cri)",
    ),
    Option(
        field="fake_gpus",
        env="GPUSHARE_FAKE_GPUS",
        flag="--fake-gpus",
        parse=_text_or_none,
        help="fake cards instead of NVML, e.g. 8x11178 or @file; unset: NVML",
    ),
    Option(
        field="metrics_port",
        env="GPUSHARE_METRICS_PORT",
        flag="--metrics-port",
        parse=options.port,
        help="Prometheus endpoint, 0 to disable",
    ),
    Option(
        field=_HEALTH_RECOVERY,
        env="GPUSHARE_HEALTH_RECOVERY_SECONDS",
        flag="--health-recovery-seconds",
        parse=options.seconds_from(0),
        help="seconds without a new XID after which an Unhealthy card is Healthy again",
    ),
    Option(
        field="allocate_wait_s",
        env="GPUSHARE_ALLOCATE_WAIT_SECONDS",
        flag="--allocate-wait-seconds",
        parse=options.seconds_from(0, meaning="no wait"),
        help="seconds Allocate waits for the operator's assignment of the pod to reach the "
        "plugin's pod watch (0: none, a pod the watch does not show yet fails at once)",
    ),
    Option(
        field="heartbeat_s",
        env="GPUSHARE_HEARTBEAT_SECONDS",
        flag="--heartbeat-seconds",
        parse=options.seconds,
        help="seconds between heartbeats on the node's GPUNode (the operator marks it Stale "
        "after its --plugin-stale-after, 90 s by default)",
    ),
    Option(
        field="scheduler_names",
        env="GPUSHARE_SCHEDULER_NAMES",
        flag="--scheduler-names",
        parse=options.scheduler_names,
        help="comma list of the schedulers (the operator's) whose pods are served",
    ),
    Option(
        field=_HEALTH_CHECKS,
        env="DP_DISABLE_HEALTHCHECKS",
        flag="--disable-healthchecks",
        parse=str,
        help="all, xids, or a comma list of XIDs to ignore; unset: all checks",
    ),
    Option(
        field="framework_limits",
        env="GPUSHARE_FRAMEWORK_LIMITS",
        flag="--framework-limits",
        parse=_frameworks,
        help="the frameworks whose own memory limits containers that share a card get, unless "
        "their pod names its own: a comma list of pytorch, jax, tensorflow (PyTorch 2.9 or "
        "later only: older releases fail on the option), all, or none",
    ),
    Option(
        field="cuda_context_mib",
        env="GPUSHARE_CUDA_CONTEXT_MIB",
        flag="--cuda-context-mib",
        parse=_mib,
        help="MiB a CUDA context holds outside the allocators, left out of their fraction",
    ),
    Option(
        field="mps",
        env="GPUSHARE_MPS",
        flag="--mps",
        parse=options.boolean,
        help="the node runs the MPS control daemon: give CUDA_MPS_PINNED_DEVICE_MEM_LIMIT too",
    ),
    Option(
        field="usage_interval_s",
        env="GPUSHARE_USAGE_INTERVAL_SECONDS",
        flag="--usage-interval-seconds",
        parse=options.seconds_from(_USAGE_INTERVAL_MIN_S),
        help="seconds between measurements of what each container's processes hold",
    ),
    Option(
        field="proc_root",
        env="GPUSHARE_PROC_ROOT",
        flag="--proc-root",
        parse=_path,
        help="where the node's processes are seen (the host's /proc: the DaemonSet has hostPID)",
    ),
    Option(
        field="pod_resources_socket",
        env="GPUSHARE_POD_RESOURCES_SOCKET",
        flag="--pod-resources-socket",
        parse=_path_or_none,
        help="the kubelet's pod-resources socket, asked whether the pod served took its grant "
        "(it is then marked gpu-assigned at once); empty: not asked, a pod is marked once its "
        "status shows it admitted",
    ),
    Option(
        field="log_level",
        env="GPUSHARE_LOG_LEVEL",
        flag="--log-level",
        parse=options.log_level,
        help="debug | info | warning | error",
    ),
)


def _defaults() -> dict[str, str]:
    """Each option's default as its variable spells it (the two health options' from the
    default HealthPolicy)."""
    return {
        **options.defaults_of(PluginConfig),
        _HEALTH_RECOVERY: options.spelled(HealthPolicy().recovery_s),
    }


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(
        prog="gpushare-device-plugin",
        description="Kubelet device plugin for volcano.sh/gpu-memory and volcano.sh/gpu-number.",
    )
    options.add_flags(parse, OPTIONS, _defaults())
    return parse


def load(flags: Mapping[str, str | None], environ: Mapping[str, str]) -> PluginConfig:
    """The configuration, each option from its flag (`flags`, by field: what `parser()`
    parsed), else its variable, else its default; ConfigError lists every problem."""
    texts = options.given(OPTIONS, flags, environ)
    values, problems = options.parse(OPTIONS, texts)
    if "node_name" not in texts:
        problems.insert(0, "NODE_NAME is required: set it from the downward API (spec.nodeName)")
    default = HealthPolicy()
    checks = values.pop(_HEALTH_CHECKS, "")
    recovery = values.pop(_HEALTH_RECOVERY, default.recovery_s)
    try:
        values["health"] = HealthPolicy.from_setting(checks, recovery)
    except ValueError as error:
        problems.append(str(error))
    if problems:
        raise ConfigError("; ".join(problems))
    return PluginConfig(**values)
