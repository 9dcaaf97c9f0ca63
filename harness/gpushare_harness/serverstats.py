"""What a benchmark reads of the processes it measures: CPU time, context switches, system
calls and resident memory from /proc, and counters from a Prometheus text exposition (the
apiserver's and etcd's /metrics)."""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


PROCESS_COUNTED = ("voluntary_switches", "involuntary_switches", "read_calls", "write_calls")
"""What `process_counts` counts, not times: how often a process gave up its CPU to wait
(voluntary context switches: it went idle and was woken again) or was put off it (involuntary:
another process took the CPU), and its read and write system calls (read/readv and
write/writev, which Go's sockets use, and files too: etcd's log among them)."""

_STATUS_SWITCHES = {
    "voluntary_ctxt_switches": "voluntary_switches",
    "nonvoluntary_ctxt_switches": "involuntary_switches",
}


def process_counts(pid: int) -> dict[str, int]:
    """A process's `PROCESS_COUNTED` so far. Context switches are summed over its threads now:
    a thread that has ended takes its own with it (Go's runtime seldom ends one)."""
    counts = dict.fromkeys(PROCESS_COUNTED, 0)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            lines = (task / "status").read_text().splitlines()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        for name, _, value in (line.partition(":") for line in lines):
            if name in _STATUS_SWITCHES:
                counts[_STATUS_SWITCHES[name]] += int(value)
    io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    counts["read_calls"], counts["write_calls"] = int(io["syscr"]), int(io["syscw"])
    return counts


def cpu_times() -> dict[int, tuple[int, int]]:
    """Each CPU's busy and total time so far (in clock ticks; /proc/stat), by CPU number:
    busy is everything but idle and I/O wait."""
    times: dict[int, tuple[int, int]] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        ticks = [int(field) for field in fields[:8]]  # user .. steal; guest is inside user
        idle = ticks[3] + ticks[4]
        times[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
    return times


def cpu_busy(
    before: dict[int, tuple[int, int]], now: dict[int, tuple[int, int]]
) -> dict[int, float]:
    """Each CPU's busy share between two `cpu_times` (0 to 1)."""
    return {
        cpu: round((busy - before[cpu][0]) / max(total - before[cpu][1], 1), 3)
        for cpu, (busy, total) in now.items()
        if cpu in before
    }


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
