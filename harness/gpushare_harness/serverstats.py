"""What a benchmark reads of the processes it measures: CPU time and resident memory from
/proc, and counters from a Prometheus text exposition (the apiserver's and etcd's /metrics)."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """A process's resident memory now (0 when /proc does not say)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def counters(text: str, wanted: Collection[str]) -> Iterator[tuple[str, dict[str, str], float]]:
    """Each sample of the `wanted` metrics (by sample name, `_total` included) in a
    Prometheus text exposition: its name, labels and value."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                yield sample.name, dict(sample.labels), sample.value
