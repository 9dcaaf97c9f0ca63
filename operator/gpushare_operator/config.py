"""The operator's configuration: defaults < environment < flags < the live GPUShareConfig.

Every field is validated at once and every problem reported together. A bad live value is
refused whole: the operator keeps the configuration it had, and says why (an Event and the
resource's status). Fields that only matter at start-up (leader election, ports) come from the
environment (or its flag) alone.

Each option is declared once, in `OPTIONS`: the field, its environment variable, its flag of
`gpushare-operator` and, for the fields a GPUShareConfig may set, its key in the spec.
`gpushare-operator --help` lists them with their defaults.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from gpushare import options
from gpushare.model import Policy, contract
from gpushare.model.admission import AdmissionSettings, LimitsIn
from gpushare.model.defrag import Defragmentation
from gpushare.model.devices import MAX_UNIT_MIB
from gpushare.model.overuse import OverUsePolicy
from gpushare.options import Option


class ConfigError(ValueError):
    """One or more configuration values are invalid; the message lists each with its fix."""


LABEL_VALUE_MAX = 63
"""The longest a Kubernetes label value may be."""


def lease_label(namespace: str, name: str) -> str:
    """`contract.LEASE_LABEL`'s value: the Lease whose leader sends a write."""
    return f"{namespace}.{name}"


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
    gang_timeout_s: float = 300.0
    max_concurrent_binds: int = 512
    leader_elect: bool = True
    lease_namespace: str = "gpushare-system"
    lease_name: str = "gpushare-scheduler"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    identity: str = field(default_factory=_default_identity)
    metrics_port: int = 9090
    status_interval_s: float = 2.0
    status_write_rate: int = 10
    plugin_stale_after_s: float = 90.0
    log_level: str = "info"
    memory_unit_mib: int = contract.DEFAULT_MEMORY_UNIT_MIB
    pod_memory_limits: LimitsIn = LimitsIn.MIB
    set_scheduler_name: bool = False
    over_use_policy: OverUsePolicy = OverUsePolicy.WARN
    over_use_grace_s: float = 30.0
    over_use_delete_after_s: float = 0.0
    """With Evict: how long evictions of an over-user may be refused (its PodDisruptionBudgets)
    before it is deleted instead; 0: never (the budgets always decide)."""
    preemption: bool = True
    defragmentation: Defragmentation = Defragmentation.OFF
    defrag_interval_s: float = 60.0
    webhook_port: int = 9443
    webhook_address: str = "127.0.0.1"  # the manifests set 0.0.0.0: the Service's pod IP
    webhook_hosts: frozenset[str] = frozenset({"gpushare-webhook.gpushare-system.svc"})
    webhook_secret: str = "gpushare-webhook-tls"  # noqa: S105 - a Secret's name
    webhook_configuration: str = "gpushare"
    webhook_cert_dir: str = ""  # empty: the operator makes its own CA (webhook_secret)

    def admission(self) -> AdmissionSettings:
        return AdmissionSettings(
            unit_mib=self.memory_unit_mib,
            limits_in=self.pod_memory_limits,
            scheduler_names=self.scheduler_names,
            set_scheduler_name=self.set_scheduler_name,
        )


_SECONDS_SCHEMA = {
    "type": "number",
    "minimum": 0,
    "exclusiveMinimum": True,
    "maximum": options.MAX_SECONDS,
}

_SECONDS_OR_NEVER_SCHEMA = {"type": "number", "minimum": 0, "maximum": options.MAX_SECONDS}


def _count(raw: str) -> int:
    return options.bounded(
        raw, int, low=1, high=10000, must="must be a whole number from 1 to 10000"
    )


def _hosts(raw: str) -> frozenset[str]:
    hosts = frozenset(part.strip() for part in raw.split(",") if part.strip())
    if not hosts:
        raise ValueError("must name at least one host")
    return hosts


OPTIONS = (
    Option(
        field="scheduler_names",
        env="GPUSHARE_SCHEDULER_NAMES",
        flag="--scheduler-names",
        live="schedulerNames",
        schema={
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "minLength": 1},
            "x-kubernetes-list-type": "set",
        },
        parse=options.scheduler_names,
        help="the spec.schedulerName values to serve (a comma list in the environment)",
    ),
    Option(
        field="policy",
        env="GPUSHARE_POLICY",
        flag="--policy",
        live="policy",
        schema={"type": "string", "enum": [p.value for p in Policy]},
        parse=options.one_of(Policy),
        help=" | ".join(Policy),
    ),
    Option(
        field="assignment_timeout_s",
        env="GPUSHARE_ASSIGNMENT_TIMEOUT",
        flag="--assignment-timeout",
        live="assignmentTimeoutSeconds",
        schema=_SECONDS_SCHEMA,
        parse=options.seconds,
        help="seconds a placement waits behind an unassigned pod of the same request on the "
        "same node before going ahead",
    ),
    Option(
        field="bind_timeout_s",
        env="GPUSHARE_BIND_TIMEOUT",
        flag="--bind-timeout",
        live="bindTimeoutSeconds",
        schema=_SECONDS_SCHEMA,
        parse=options.seconds,
        help="seconds for each API call (a Binding, an Event, a read, a write, the Lease)",
    ),
    Option(
        field="backoff_initial_s",
        env="GPUSHARE_BACKOFF_INITIAL",
        flag="--backoff-initial",
        live="backoffInitialSeconds",
        schema=_SECONDS_SCHEMA,
        parse=options.seconds,
        help="first retry backoff after a failed bind, seconds",
    ),
    Option(
        field="backoff_max_s",
        env="GPUSHARE_BACKOFF_MAX",
        flag="--backoff-max",
        live="backoffMaxSeconds",
        schema=_SECONDS_SCHEMA,
        parse=options.seconds,
        help="longest retry backoff after a failed bind, seconds",
    ),
    Option(
        field="unschedulable_retry_s",
        env="GPUSHARE_UNSCHEDULABLE_RETRY",
        flag="--unschedulable-retry",
        live="unschedulableRetrySeconds",
        schema=_SECONDS_SCHEMA,
        parse=options.seconds,
        help="seconds after which an unschedulable pod is tried again even if nothing changed",
    ),
    Option(
        field="gang_timeout_s",
        env="GPUSHARE_GANG_TIMEOUT",
        flag="--gang-timeout",
        live="gangTimeoutSeconds",
        schema=_SECONDS_SCHEMA,
        parse=options.seconds,
        help="seconds after its PodGroup's creation that a gang still short of minMember pods "
        "is reported timed out (a coscheduling PodGroup's scheduleTimeoutSeconds wins)",
    ),
    Option(
        field="max_concurrent_binds",
        env="GPUSHARE_MAX_CONCURRENT_BINDS",
        flag="--max-concurrent-binds",
        parse=_count,
        help="Binding calls in flight at once",
    ),
    Option(
        field="leader_elect",
        env="GPUSHARE_LEADER_ELECT",
        flag="--leader-elect",
        parse=options.boolean,
        help="true | false: only the Lease holder binds",
    ),
    Option(
        field="lease_namespace",
        env="GPUSHARE_LEASE_NAMESPACE",
        flag="--lease-namespace",
        parse=options.nonblank,
        help="namespace of the Lease",
    ),
    Option(
        field="lease_name",
        env="GPUSHARE_LEASE_NAME",
        flag="--lease-name",
        parse=options.nonblank,
        help="name of the Lease",
    ),
    Option(
        field="lease_duration_s",
        env="GPUSHARE_LEASE_DURATION",
        flag="--lease-duration",
        parse=options.seconds,
        help="seconds a Lease lasts without renewal",
    ),
    Option(
        field="renew_deadline_s",
        env="GPUSHARE_RENEW_DEADLINE",
        flag="--renew-deadline",
        parse=options.seconds,
        help="seconds the leader has to renew before it stops binding",
    ),
    Option(
        field="retry_period_s",
        env="GPUSHARE_RETRY_PERIOD",
        flag="--retry-period",
        parse=options.seconds,
        help="seconds between tries to take or renew the Lease",
    ),
    Option(
        field="identity",
        env="GPUSHARE_IDENTITY",
        flag="--identity",
        parse=options.nonblank,
        help="this replica's name in the Lease; default $POD_NAME, else host-pid",
    ),
    Option(
        field="metrics_port",
        env="GPUSHARE_METRICS_PORT",
        flag="--metrics-port",
        parse=options.port,
        help="Prometheus endpoint, 0 to disable",
    ),
    Option(
        field="status_interval_s",
        env="GPUSHARE_STATUS_INTERVAL",
        flag="--status-interval",
        parse=options.seconds,
        help="seconds between GPUNode status updates",
    ),
    Option(
        field="status_write_rate",
        env="GPUSHARE_STATUS_WRITE_RATE",
        flag="--status-write-rate",
        parse=_count,
        help="GPUNode status writes per second at most: under a burst a node's status lags "
        "(a write then covers several pods) instead of competing with the binds",
    ),
    Option(
        field="plugin_stale_after_s",
        env="GPUSHARE_PLUGIN_STALE_AFTER",
        flag="--plugin-stale-after",
        parse=options.seconds,
        help="seconds without a device plugin's heartbeat after which its GPUNode is Stale "
        "(and not Ready): three of the plugins' --heartbeat-seconds",
    ),
    Option(
        field="log_level",
        env="GPUSHARE_LOG_LEVEL",
        flag="--log-level",
        parse=options.log_level,
        help="debug | info | warning | error",
    ),
    Option(
        field="memory_unit_mib",
        env="GPUSHARE_MEMORY_UNIT_MIB",
        flag="--memory-unit-mib",
        live="memoryUnitMiB",
        schema={"type": "integer", "minimum": 1, "maximum": MAX_UNIT_MIB},
        parse=options.memory_unit,
        help="MiB per gpu-memory device, the device plugins' GPU_MEMORY_FACTOR: the admission "
        "webhook converts new pods' limits to it",
    ),
    Option(
        field="pod_memory_limits",
        env="GPUSHARE_POD_MEMORY_LIMITS",
        flag="--pod-memory-limits",
        live="podMemoryLimits",
        schema={"type": "string", "enum": [unit.value for unit in LimitsIn]},
        parse=options.one_of(LimitsIn),
        help="what pods' gpu-memory limits count: MiB (converted at creation) | Units (left "
        "as written, as with Volcano's --gpu-memory-factor)",
    ),
    Option(
        field="set_scheduler_name",
        env="GPUSHARE_SET_SCHEDULER_NAME",
        flag="--set-scheduler-name",
        live="setSchedulerName",
        schema={"type": "boolean"},
        parse=options.boolean,
        help="true | false: give GPU pods that name kube-scheduler the first served name "
        "(else they are refused at creation)",
    ),
    Option(
        field="over_use_policy",
        env="GPUSHARE_OVER_USE_POLICY",
        flag="--over-use-policy",
        live="overUsePolicy",
        schema={"type": "string", "enum": [p.value for p in OverUsePolicy]},
        parse=options.one_of(OverUsePolicy),
        help="what to do when a container holds more GPU memory than it was granted, as the "
        "device plugin measured it: Ignore, Warn (an Event on its pod) or Evict (also evict "
        "the pod, PodDisruptionBudgets respected)",
    ),
    Option(
        field="over_use_grace_s",
        env="GPUSHARE_OVER_USE_GRACE",
        flag="--over-use-grace",
        live="overUseGraceSeconds",
        schema=_SECONDS_SCHEMA,
        parse=options.seconds,
        help="seconds a container stays over its grant before the over-use policy acts",
    ),
    Option(
        field="over_use_delete_after_s",
        env="GPUSHARE_OVER_USE_DELETE_AFTER",
        flag="--over-use-delete-after",
        live="overUseDeleteAfterSeconds",
        schema=_SECONDS_OR_NEVER_SCHEMA,
        parse=options.seconds_from(0, meaning="never"),
        help="with Evict: seconds the evictions of a pod over its grant may be refused (its "
        "PodDisruptionBudgets, which a tenant may create) before it is deleted instead; 0: never, "
        "the budgets always decide",
    ),
    Option(
        field="preemption",
        env="GPUSHARE_PREEMPTION",
        flag="--preemption",
        live="preemption",
        schema={"type": "boolean"},
        parse=options.boolean,
        help="true | false: a pending GPU pod that fits no card evicts pods of lower "
        "priority from the one card (or node, for whole cards) where that costs least",
    ),
    Option(
        field="defragmentation",
        env="GPUSHARE_DEFRAGMENTATION",
        flag="--defragmentation",
        live="defragmentation",
        schema={"type": "string", "enum": [d.value for d in Defragmentation]},
        parse=options.one_of(Defragmentation),
        help="what the operator does on its own when waiting pods would fit if others moved: "
        "Off, Plan (an Event on each such pod and metrics saying what moving would free) or "
        "Auto (also move them: one waiting pod's moves per interval)",
    ),
    Option(
        field="defrag_interval_s",
        env="GPUSHARE_DEFRAG_INTERVAL",
        flag="--defrag-interval",
        live="defragmentationIntervalSeconds",
        schema=_SECONDS_SCHEMA,
        parse=options.seconds,
        help="seconds between two defragmentation plans (with Auto: between two waiting pods' "
        "moves)",
    ),
    Option(
        field="webhook_port",
        env="GPUSHARE_WEBHOOK_PORT",
        flag="--webhook-port",
        parse=options.port,
        help="HTTPS port of the admission webhook, 0 to disable",
    ),
    Option(
        field="webhook_address",
        env="GPUSHARE_WEBHOOK_ADDRESS",
        flag="--webhook-address",
        parse=options.nonblank,
        help="address the admission webhook listens on (0.0.0.0 in a pod, for its Service)",
    ),
    Option(
        field="webhook_hosts",
        env="GPUSHARE_WEBHOOK_HOSTS",
        flag="--webhook-hosts",
        parse=_hosts,
        help="comma list of the names (DNS or IP) the apiserver calls the webhook by: its "
        "serving certificate's names",
    ),
    Option(
        field="webhook_secret",
        env="GPUSHARE_WEBHOOK_SECRET",
        flag="--webhook-secret",
        parse=options.nonblank,
        help="Secret in the Lease's namespace holding the webhook's CA and certificate (made "
        "by the first replica, shared by all)",
    ),
    Option(
        field="webhook_configuration",
        env="GPUSHARE_WEBHOOK_CONFIGURATION",
        flag="--webhook-configuration",
        parse=options.nonblank,
        help="MutatingWebhookConfiguration whose caBundle the operator keeps current",
    ),
    Option(
        field="webhook_cert_dir",
        env="GPUSHARE_WEBHOOK_CERT_DIR",
        flag="--webhook-cert-dir",
        parse=str.strip,
        help="folder holding the webhook's tls.crt and tls.key from another issuer (a mounted "
        "cert-manager Secret), read again when they change; the operator then makes no CA, "
        "no Secret and leaves the caBundle to that issuer. Empty: it makes its own",
    ),
)

# The fields a GPUShareConfig resource may set, by their names in its spec.
LIVE_FIELDS = {option.live: option.field for option in OPTIONS if option.live}


def live_view(config: OperatorConfig) -> dict[str, object]:
    """`config`'s values of the live fields, as a GPUShareConfig spec writes them (what
    `with_live` reads back): the operator publishes it (`contract.EFFECTIVE_CONFIG`)."""
    shown: dict[str, object] = {}
    for option in OPTIONS:
        if option.live:
            value = getattr(config, option.field)
            if isinstance(value, frozenset):
                value = sorted(value)
            elif isinstance(value, Enum):
                value = value.value
            shown[option.live] = value
    return shown


def live_spec_schema() -> dict[str, object]:
    """The OpenAPI schema of a GPUShareConfig's spec, from `OPTIONS` (the CRD must hold it:
    tests/unit/test_manifests.py): each live key with its type, bounds and help, so that
    `kubectl explain gpushareconfig.spec` documents it and the apiserver refuses a bad value
    (and, with kubectl's strict field validation, an unknown key) at apply time. The operator
    still checks what a schema cannot: values against the environment's (a backoff initial
    above the maximum)."""
    return {
        "type": "object",
        "description": "Fields left out keep the operator's flag or environment value.",
        "properties": {
            option.live: {**option.schema, "description": _described(option)}
            for option in OPTIONS
            if option.live and option.schema
        },
    }


def _described(option: Option) -> str:
    default = options.defaults_of(OperatorConfig)[option.field]
    return f"{option.help}. Default: {default} (${option.env})."


def add_flags(parser: argparse.ArgumentParser) -> None:
    """A flag per option, its help naming the variable and the default."""
    options.add_flags(parser, OPTIONS, options.defaults_of(OperatorConfig))


def _apply(base: OperatorConfig, texts: Mapping[str, tuple[str, str]]) -> OperatorConfig:
    """`base` with `texts` ({field: (where, raw text)}) parsed in; ConfigError lists all
    problems."""
    changes, problems = options.parse(OPTIONS, texts)
    merged = replace(base, **changes)
    if merged.backoff_initial_s > merged.backoff_max_s:
        problems.append("backoff initial must not exceed backoff max")
    if merged.renew_deadline_s >= merged.lease_duration_s:
        problems.append("the renew deadline must be shorter than the lease duration")
    label = lease_label(merged.lease_namespace, merged.lease_name)
    if len(label) > LABEL_VALUE_MAX:
        problems.append(
            f"the Lease's namespace and name joined by a dot ({label!r}, {len(label)} "
            f"characters) must fit a label value ({LABEL_VALUE_MAX}): the leader's writes "
            "name it; choose a shorter GPUSHARE_LEASE_NAME"
        )
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))
    return merged


def load(flags: Mapping[str, str | None], environ: Mapping[str, str]) -> OperatorConfig:
    """The start-up configuration, each option from its flag (`flags`, by field: what
    `add_flags` parsed), else its GPUSHARE_* variable, else its default."""
    return _apply(OperatorConfig(), options.given(OPTIONS, flags, environ))


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
    for option in OPTIONS:
        value = getattr(config, option.field)
        shown[option.field] = sorted(value) if isinstance(value, frozenset) else value
    return shown
