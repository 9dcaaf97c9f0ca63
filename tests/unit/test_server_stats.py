"""What the benchmarks count of a server process: its context switches and system calls."""

from __future__ import annotations

import subprocess
import sys

from gpushare_harness.serverstats import PROCESS_COUNTED, process_counts

# A child whose work is all in a second thread (its main thread only waits for it): for each
# line it reads (and so waits for), five writes to /dev/null and one answer.
SERVE_IN_A_THREAD = """
import os, threading
def serve():
    null = os.open(os.devnull, os.O_WRONLY)
    while line := os.read(0, 64):
        for _ in range(5):
            os.write(null, line)
        os.write(1, line)
worker = threading.Thread(target=serve)
worker.start()
worker.join()
"""


def test_the_counts_are_the_processs_own_over_all_its_threads() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", SERVE_IN_A_THREAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as child:
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.write(b"ready\n")
        child.stdin.flush()
        child.stdout.readline()  # started, and waiting for the next line
        before = process_counts(child.pid)
        for number in range(200):  # this process writes 200 times, the child 1,200
            child.stdin.write(f"{number}\n".encode())
            child.stdin.flush()
            child.stdout.readline()
        after = process_counts(child.pid)
        child.stdin.close()
    grown = {what: after[what] - before[what] for what in PROCESS_COUNTED}
    assert set(after) == set(PROCESS_COUNTED)
    assert grown["write_calls"] >= 1200
    assert grown["read_calls"] >= 200
    # Only the worker thread left its CPU for each line (its main thread was in join()
    # throughout); whether the kernel counts a switch as voluntary depends on timing.
    assert grown["voluntary_switches"] + grown["involuntary_switches"] >= 200
