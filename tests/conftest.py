"""Every test directory's: under CI (`CI` set, as `.ci/run` runs) a skipped test fails, so a
missing package, no root or no control plane never passes a run unnoticed. Each test's
outcome is kept on its item for its fixtures' teardown (`failure_logs.failed`). What an
operator run in-process froze for the garbage collector is thawed after each test."""

from __future__ import annotations

import gc
import os
from collections.abc import Generator, Iterator

import pytest
from failure_logs import CALL_FAILED


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if os.environ.get("CI") and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, where every test must run: {reason}"
    if report.when == "call":
        item.stash[CALL_FAILED] = report.failed
    return report


@pytest.fixture(autouse=True)
def collector_thawed() -> Iterator[None]:
    """An operator freezes its heap once it has listed (`runtime.release_memory`): the cache it
    keeps. A test process runs many, and must still collect the cycles each leaves."""
    yield
    gc.unfreeze()
