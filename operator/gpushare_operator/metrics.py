"""Prometheus metrics of the scheduler (served by prometheus_client on its own thread), in
base units (seconds, bytes), named as kube-scheduler names its own where one exists
(`scheduler_pending_pods`, `scheduler_scheduling_attempt_duration_seconds`)."""

from __future__ import annotations

import platform
from importlib.metadata import version

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, start_http_server

MIB = 1 << 20


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        Info("gpushare_build", "The operator's version.", registry=self.registry).info(
            {"version": version("kube-gpushare"), "python": platform.python_version()}
        )
        self.attempts = Counter(
            "gpushare_schedule_attempts_total",
            "Scheduling attempts by result (scheduled, unschedulable, error).",
            ["result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "gpushare_pod_scheduling_seconds",
            "Time from pod creation to a successful bind.",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=self.registry,
        )
        self.attempt_duration = Histogram(
            "gpushare_scheduling_attempt_duration_seconds",
            "Time to decide for one pod (filter, score, assume), by result.",
            ["result"],
            buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1),
            registry=self.registry,
        )
        self.card_allocated_bytes = Gauge(
            "gpushare_card_allocated_bytes",
            "GPU memory allocated on each card (gpu-number pods hold the whole card).",
            ["node", "card"],
            registry=self.registry,
        )
        self.card_capacity_bytes = Gauge(
            "gpushare_card_capacity_bytes",
            "GPU memory of each card, as its device plugin reported it.",
            ["node", "card"],
            registry=self.registry,
        )
        self.pending_pods = Gauge(
            "gpushare_pending_pods",
            "Pods waiting to be scheduled, by queue (active, backoff, unschedulable).",
            ["queue"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "gpushare_leader", "1 while this replica holds the Lease.", registry=self.registry
        )
        self.over_use = Counter(
            "gpushare_over_use_total",
            "Containers found over their GPU memory share for the grace period, by what was "
            "done (warned, evicted, eviction_refused, deleted, delete_failed).",
            ["action"],
            registry=self.registry,
        )

        # kube-scheduler: preemption_attempts_total and preemption_victims.
        self.preemption_attempts = Counter(
            "gpushare_preemption_attempts_total",
            "Pods that fit no card for which preemption was tried, by result (nominated: "
            "victims chosen; none: no eligible set).",
            ["result"],
            registry=self.registry,
        )
        self.preemption_victims = Counter(
            "gpushare_preemption_victims_total",
            "Pods evicted to make room for pods of higher priority.",
            registry=self.registry,
        )

        self.defrag_moves = Gauge(
            "gpushare_defrag_moves",
            "Pods the defragmentation plan moves so that waiting pods fit (Plan and Auto).",
            registry=self.registry,
        )
        self.defrag_freeable_bytes = Gauge(
            "gpushare_defrag_freeable_bytes",
            "GPU memory the plan's moves would free on the cards it makes whole.",
            registry=self.registry,
        )

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)
