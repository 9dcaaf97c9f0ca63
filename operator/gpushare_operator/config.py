"""The operator's configuration: defaults < environment < the live GPUShareConfig resource.

Every field is validated at once and every problem reported together. A bad live value is
refused whole: the operator keeps the configuration it had, and says why (an Event and the
resource's status). Fields that only matter at start-up (leader election, ports) come from the
environment alone.

Environment (defaults in brackets):
    GPUSHARE_SCHEDULER_NAMES    comma list of spec.schedulerName values to serve [volcano]
    GPUSHARE_POLICY             bestfit | firstfit | binpack | spread [bestfit]
    GPUSHARE_ASSIGNMENT_TIMEOUT seconds a placement waits behind an unassigned pod of the
                                same request on the same node before going ahead [60]
    GPUSHARE_BIND_TIMEOUT       seconds for one Binding call [10]
    GPUSHARE_BACKOFF_INITIAL / GPUSHARE_BACKOFF_MAX   retry backoff after a failed bind [1 / 10]
    GPUSHARE_UNSCHEDULABLE_RETRY seconds after which an unschedulable pod is tried again even
                                if nothing changed [60]
    GPUSHARE_MAX_CONCURRENT_BINDS  Binding calls in flight at once [32]
    GPUSHARE_LEADER_ELECT       true | false: only the Lease holder binds [true]
    GPUSHARE_LEASE_NAMESPACE / GPUSHARE_LEASE_NAME   [gpushare-system / gpushare-scheduler]
    GPUSHARE_LEASE_DURATION / GPUSHARE_RENEW_DEADLINE / GPUSHARE_RETRY_PERIOD   [15 / 10 / 2]
    GPUSHARE_IDENTITY           this replica's name in the Lease [POD_NAME, else host-pid]
    GPUSHARE_METRICS_PORT       Prometheus endpoint, 0 to disable [9090]
    GPUSHARE_STATUS_INTERVAL    seconds between GPUNode status updates [2]
    GPUSHARE_LOG_LEVEL          debug | info | warning | error [info]
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from gpushare.model import Policy, contract


class ConfigError(ValueError):
    """One or more configuration values are invalid; the message lists each with its fix."""


def _default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, kw_only=True)
class OperatorConfig:
    scheduler_names: frozenset[str] = frozenset({contract.DEFAULT_SCHEDULER_NAME})
    policy: Policy = Policy.BESTFIT
    assignment_timeout_s: float = 60.0
    bind_timeout_s: float = 10.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 10.0
    unschedulable_retry_s: float = 60.0
    max_concurrent_binds: int = 32
    leader_elect: bool = True
    lease_namespace: str = "gpushare-system"
    lease_name: str = "gpushare-scheduler"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    identity: str = field(default_factory=_default_identity)
    metrics_port: int = 9090
    status_interval_s: float = 2.0
    log_level: str = "info"


def _names(raw: str) -> frozenset[str]:
    names = frozenset(part.strip() for part in raw.split(",") if part.strip())
    if not names:
        raise ValueError("needs at least one scheduler name")
    return names


def _seconds(raw: str) -> float:
    value = float(raw)
    if not 0 < value <= 86400:
        raise ValueError("must be a number of seconds above 0 and at most 86400")
    return value


def _count(raw: str) -> int:
    value = int(raw)
    if not 1 <= value <= 10000:
        raise ValueError("must be a whole number from 1 to 10000")
    return value


def _port(raw: str) -> int:
    value = int(raw)
    if not 0 <= value <= 65535:
        raise ValueError("must be a port number (0 disables)")
    return value


def _flag(raw: str) -> bool:
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise ValueError("must be true or false")


def _level(raw: str) -> str:
    if raw.lower() not in ("debug", "info", "warning", "error"):
        raise ValueError("must be debug, info, warning or error")
    return raw.lower()


def _text(raw: str) -> str:
    if not raw.strip():
        raise ValueError("must not be empty")
    return raw.strip()


_PARSERS: dict[str, Callable[[str], Any]] = {
    "scheduler_names": _names,
    "policy": Policy,
    "assignment_timeout_s": _seconds,
    "bind_timeout_s": _seconds,
    "backoff_initial_s": _seconds,
    "backoff_max_s": _seconds,
    "unschedulable_retry_s": _seconds,
    "max_concurrent_binds": _count,
    "leader_elect": _flag,
    "lease_namespace": _text,
    "lease_name": _text,
    "lease_duration_s": _seconds,
    "renew_deadline_s": _seconds,
    "retry_period_s": _seconds,
    "identity": _text,
    "metrics_port": _port,
    "status_interval_s": _seconds,
    "log_level": _level,
}

_ENV = {
    "scheduler_names": "GPUSHARE_SCHEDULER_NAMES",
    "policy": "GPUSHARE_POLICY",
    "assignment_timeout_s": "GPUSHARE_ASSIGNMENT_TIMEOUT",
    "bind_timeout_s": "GPUSHARE_BIND_TIMEOUT",
    "backoff_initial_s": "GPUSHARE_BACKOFF_INITIAL",
    "backoff_max_s": "GPUSHARE_BACKOFF_MAX",
    "unschedulable_retry_s": "GPUSHARE_UNSCHEDULABLE_RETRY",
    "max_concurrent_binds": "GPUSHARE_MAX_CONCURRENT_BINDS",
    "leader_elect": "GPUSHARE_LEADER_ELECT",
    "lease_namespace": "GPUSHARE_LEASE_NAMESPACE",
    "lease_name": "GPUSHARE_LEASE_NAME",
    "lease_duration_s": "GPUSHARE_LEASE_DURATION",
    "renew_deadline_s": "GPUSHARE_RENEW_DEADLINE",
    "retry_period_s": "GPUSHARE_RETRY_PERIOD",
    "identity": "GPUSHARE_IDENTITY",
    "metrics_port": "GPUSHARE_METRICS_PORT",
    "status_interval_s": "GPUSHARE_STATUS_INTERVAL",
    "log_level": "GPUSHARE_LOG_LEVEL",
}

# The fields a GPUShareConfig resource may set, by their names in its spec.
LIVE_FIELDS = {
    "schedulerNames": "scheduler_names",
    "policy": "policy",
    "assignmentTimeoutSeconds": "assignment_timeout_s",
    "bindTimeoutSeconds": "bind_timeout_s",
    "backoffInitialSeconds": "backoff_initial_s",
    "backoffMaxSeconds": "backoff_max_s",
    "unschedulableRetrySeconds": "unschedulable_retry_s",
}


def _apply(base: OperatorConfig, values: Mapping[str, tuple[str, str]]) -> OperatorConfig:
    """`base` with `values` ({field: (where, raw text)}) parsed in; ConfigError lists all
    problems."""
    changes: dict[str, Any] = {}
    problems = []
    for name, (where, raw) in values.items():
        try:
            changes[name] = _PARSERS[name](raw)
        except ValueError as error:
            hint = "; ".join(p.value for p in Policy) if name == "policy" else str(error)
            problems.append(f"{where}={raw!r}: {hint}")
    merged = replace(base, **changes)
    if merged.backoff_initial_s > merged.backoff_max_s:
        problems.append("backoff initial must not exceed backoff max")
    if merged.renew_deadline_s >= merged.lease_duration_s:
        problems.append("the renew deadline must be shorter than the lease duration")
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))
    return merged


def from_env(environ: Mapping[str, str] | None = None) -> OperatorConfig:
    """The start-up configuration: defaults overridden by the GPUSHARE_* environment."""
    env = os.environ if environ is None else environ
    values = {name: (var, env[var]) for name, var in _ENV.items() if var in env}
    return _apply(OperatorConfig(), values)


def with_live(base: OperatorConfig, spec: Mapping[str, object]) -> OperatorConfig:
    """`base` with a GPUShareConfig spec applied; ConfigError (and nothing applied) on any
    unknown field or invalid value."""
    values: dict[str, tuple[str, str]] = {}
    unknown = sorted(set(spec) - set(LIVE_FIELDS))
    if unknown:
        raise ConfigError(
            f"invalid configuration: unknown field(s) {', '.join(unknown)}; known: "
            f"{', '.join(LIVE_FIELDS)}"
        )
    for key, value in spec.items():
        raw = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        values[LIVE_FIELDS[key]] = (f"spec.{key}", raw)
    return _apply(base, values)


def describe(config: OperatorConfig) -> dict[str, object]:
    """The effective configuration, for the start-up log line."""
    shown: dict[str, object] = {}
    for item in fields(config):
        value = getattr(config, item.name)
        shown[item.name] = sorted(value) if isinstance(value, frozenset) else value
    return shown
