"""Prometheus metrics of the scheduler (served by prometheus_client on its own thread)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
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
        self.card_allocated_mib = Gauge(
            "gpushare_card_allocated_mib",
            "GPU memory allocated on each card, in MiB (gpu-number pods hold the whole card).",
            ["node", "card"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "gpushare_queue_pods",
            "Pods waiting to be scheduled, by queue.",
            ["queue"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "gpushare_leader", "1 while this replica holds the Lease.", registry=self.registry
        )

    def serve(self, port: int) -> None:
        if port:
            start_http_server(port, registry=self.registry)
