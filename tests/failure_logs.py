"""A test's outcome as its fixtures see it in their teardown (`failed`), set by the root
conftest's report hook, so that a fixture can print the logs of what it started when the test
failed: CI keeps only the run's output."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from gpushare_harness.process import LoggedProcess

CALL_FAILED = pytest.StashKey[bool]()

LOG_LINES = 80
"""Lines of each log printed after a failure: the last moments, enough to see what waited."""


def failed(request: pytest.FixtureRequest) -> bool:
    """Whether the test that `request` serves failed."""
    item: pytest.Item = request.node
    return item.stash.get(CALL_FAILED, False)


def print_logs(request: pytest.FixtureRequest, processes: Iterable[LoggedProcess]) -> None:
    """The last `LOG_LINES` of each process's log, once its test failed."""
    if failed(request):
        print_logs_now(processes)


def print_logs_now(processes: Iterable[LoggedProcess]) -> None:
    """The last `LOG_LINES` of each process's log."""
    for process in processes:
        print(f"\n----- last {LOG_LINES} lines of {process.log} -----\n{process.tail(LOG_LINES)}")
