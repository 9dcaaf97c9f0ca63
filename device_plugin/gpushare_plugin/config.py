"""The device plugin's configuration: flags, each with an environment-variable twin.

A flag wins over its variable, the variable over the default. Every problem is reported
together, with the fix.

    flag                        variable                         default
    --node-name                 NODE_NAME (required)             -
    --kubeconfig                KUBECONFIG                       in-cluster service account
    --socket-dir                GPUSHARE_SOCKET_DIR              /var/lib/kubelet/device-plugins
    --gpu-memory-factor         GPU_MEMORY_FACTOR                1 (MiB per device; or auto)
    --visible-devices           GPUSHARE_VISIBLE_DEVICES         index (or uuid)
    --fake-gpus                 GPUSHARE_FAKE_GPUS               - (NVML); e.g. 8x11178, @file
    --metrics-port              GPUSHARE_METRICS_PORT            9402 (0 disables)
    --health-recovery-seconds   GPUSHARE_HEALTH_RECOVERY_SECONDS 300
    --allocate-wait-seconds     GPUSHARE_ALLOCATE_WAIT_SECONDS   5
    --scheduler-names           GPUSHARE_SCHEDULER_NAMES         volcano (the operator's)
    --disable-healthchecks      DP_DISABLE_HEALTHCHECKS          - (all, xids, or XID list)
    --log-level                 GPUSHARE_LOG_LEVEL               info
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpushare.model import contract
from gpushare.model.allocation import VisibleDevices
from gpushare_plugin.health import HealthPolicy

DEFAULT_SOCKET_DIR = Path("/var/lib/kubelet/device-plugins")

_VARIABLES = {
    "node_name": "NODE_NAME",
    "kubeconfig": "KUBECONFIG",
    "socket_dir": "GPUSHARE_SOCKET_DIR",
    "gpu_memory_factor": "GPU_MEMORY_FACTOR",
    "visible_devices": "GPUSHARE_VISIBLE_DEVICES",
    "fake_gpus": "GPUSHARE_FAKE_GPUS",
    "metrics_port": "GPUSHARE_METRICS_PORT",
    "health_recovery_seconds": "GPUSHARE_HEALTH_RECOVERY_SECONDS",
    "allocate_wait_seconds": "GPUSHARE_ALLOCATE_WAIT_SECONDS",
    "scheduler_names": "GPUSHARE_SCHEDULER_NAMES",
    "disable_healthchecks": "DP_DISABLE_HEALTHCHECKS",
    "log_level": "GPUSHARE_LOG_LEVEL",
}
_DEFAULTS = {
    "socket_dir": str(DEFAULT_SOCKET_DIR),
    "gpu_memory_factor": "1",
    "visible_devices": VisibleDevices.INDEX.value,
    "metrics_port": "9402",
    "health_recovery_seconds": "300",
    "allocate_wait_seconds": "5",
    "scheduler_names": contract.DEFAULT_SCHEDULER_NAME,
    "disable_healthchecks": "",
    "log_level": "info",
}
AUTO = "auto"
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the terminating NUL


class ConfigError(ValueError):
    """Invalid flags or variables; the message lists each with its fix."""


@dataclass(frozen=True, kw_only=True)
class PluginConfig:
    node_name: str
    kubeconfig: Path | None
    socket_dir: Path
    gpu_memory_factor: int | None
    """MiB per gpu-memory device; None for `auto` (the smallest that fits the kubelet)."""
    visible_devices: VisibleDevices
    fake_gpus: str | None
    metrics_port: int
    health: HealthPolicy
    allocate_wait_s: float
    scheduler_names: frozenset[str]
    """Only pods of these schedulers (the operator's) are served."""
    log_level: str


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(
        prog="gpushare-device-plugin",
        description="Kubelet device plugin for volcano.sh/gpu-memory and volcano.sh/gpu-number.",
    )
    for dest, variable in _VARIABLES.items():
        default = _DEFAULTS.get(dest)
        shown = f" [{default}]" if default else ""
        parse.add_argument(
            f"--{dest.replace('_', '-')}", dest=dest, help=f"also ${variable}{shown}"
        )
    return parse


def load(argv: Sequence[str] | None, environ: Mapping[str, str]) -> PluginConfig:
    args = vars(parser().parse_args(argv))
    raw = {
        dest: args[dest] if args[dest] is not None else environ.get(var, _DEFAULTS.get(dest, ""))
        for dest, var in _VARIABLES.items()
    }
    problems: list[str] = []

    def number(dest: str, kind: type[int] | type[float], low: float) -> float:
        try:
            value = kind(raw[dest])
        except ValueError:
            value = low - 1
        if value < low:
            problems.append(f"--{dest.replace('_', '-')}={raw[dest]!r} must be a number >= {low}")
        return value

    if not raw["node_name"]:
        problems.append("NODE_NAME is required: set it from the downward API (spec.nodeName)")
    factor: int | None = None
    if raw["gpu_memory_factor"].strip().lower() != AUTO:
        factor = int(number("gpu_memory_factor", int, 1))
    if raw["visible_devices"] not in {v.value for v in VisibleDevices}:
        problems.append(f"--visible-devices={raw['visible_devices']!r} must be index or uuid")
    port = int(number("metrics_port", int, 0))
    recovery = number("health_recovery_seconds", float, 0)
    wait = number("allocate_wait_seconds", float, 0)
    health = HealthPolicy()
    try:
        health = HealthPolicy.from_setting(raw["disable_healthchecks"], recovery)
    except ValueError as error:
        problems.append(str(error))
    if raw["log_level"].lower() not in {"debug", "info", "warning", "error"}:
        problems.append(f"--log-level={raw['log_level']!r} must be debug, info, warning or error")
    longest = Path(raw["socket_dir"]) / "volcano-gpu-memory.sock"
    if len(str(longest).encode()) > _SOCKET_PATH_MAX:
        problems.append(
            f"--socket-dir={raw['socket_dir']!r} is too long: a unix socket path has at most "
            f"{_SOCKET_PATH_MAX} bytes and {longest} has {len(str(longest).encode())}"
        )
    schedulers = frozenset(n.strip() for n in raw["scheduler_names"].split(",") if n.strip())
    if not schedulers:
        problems.append("--scheduler-names must name at least one scheduler (default volcano)")
    if problems:
        raise ConfigError("; ".join(problems))
    return PluginConfig(
        node_name=raw["node_name"],
        kubeconfig=Path(raw["kubeconfig"]) if raw["kubeconfig"] else None,
        socket_dir=Path(raw["socket_dir"]),
        gpu_memory_factor=factor,
        visible_devices=VisibleDevices(raw["visible_devices"]),
        fake_gpus=raw["fake_gpus"] or None,
        metrics_port=port,
        health=health,
        allocate_wait_s=wait,
        scheduler_names=schedulers,
        log_level=raw["log_level"].lower(),
    )
