"""Argument types the benchmarks share: bad input gets argparse's clear error, not a crash
minutes into a run."""

from __future__ import annotations

import argparse
import os


def positive(text: str) -> int:
    """A whole number of at least 1."""
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number of at least 1")
    return number


def env_setting(text: str) -> tuple[str, str]:
    """NAME=VALUE, for a process's environment."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def cpu_list(text: str) -> set[int]:
    """CPU numbers separated by commas, each one this process may run on, and not all of
    them (the rest run everything else)."""
    try:
        cpus = {int(part) for part in text.split(",")}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not CPU numbers separated by commas"
        ) from None
    allowed = os.sched_getaffinity(0)
    if not cpus <= allowed:
        raise argparse.ArgumentTypeError(
            f"CPUs {sorted(cpus - allowed)} are not among this process's {sorted(allowed)}"
        )
    if cpus == allowed:
        raise argparse.ArgumentTypeError(f"{text!r} leaves no CPU for the rest; name fewer")
    return cpus
