"""What the benchmarks count of a server process: its wake-ups and its system calls."""

from __future__ import annotations

import subprocess
import sys

from gpushare_harness.serverstats import process_counts

# A child that reads its stdin line by line, one read call and one wait for each line; it
# answers each, so that the test waits for it between lines.
ECHO = """
import os
while line := os.read(0, 64):
    os.write(1, line)
"""


def test_a_process_woken_for_each_of_200_lines_is_counted_with_their_reads_and_writes() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as child:
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.write(b"ready\n")
        child.stdin.flush()
        child.stdout.readline()  # started and waiting for input
        before = process_counts(child.pid)
        for number in range(200):
            child.stdin.write(f"{number}\n".encode())
            child.stdin.flush()
            child.stdout.readline()
        after = process_counts(child.pid)
        child.stdin.close()
    assert after["read_calls"] - before["read_calls"] >= 200
    assert after["write_calls"] - before["write_calls"] >= 200
    assert after["context_switches"] - before["context_switches"] >= 200  # it slept each time
