"""The benchmarks' argument types refuse bad input at once, with what is wrong."""

from __future__ import annotations

import argparse
import os

import pytest

from gpushare_harness.benchargs import cpu_list


def test_server_cpus_must_be_numbers() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="not CPU numbers"):
        cpu_list("0-1")


def test_server_cpus_must_be_cpus_this_process_may_use() -> None:
    missing = max(os.sched_getaffinity(0)) + 1
    with pytest.raises(argparse.ArgumentTypeError, match=rf"CPUs \[{missing}\] are not among"):
        cpu_list(f"{missing}")


def test_server_cpus_must_leave_a_cpu_for_the_rest() -> None:
    every = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    with pytest.raises(argparse.ArgumentTypeError, match="leaves no CPU for the rest"):
        cpu_list(every)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_server_cpus_take_a_subset() -> None:
    first = min(os.sched_getaffinity(0))
    assert cpu_list(str(first)) == {first}
