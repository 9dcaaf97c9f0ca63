"""Every line a gpushare process logs is one JSON object with the same keys: its own lines and
the libraries' (kopf, aiohttp, asyncio, the Kubernetes client log through `logging`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from gpushare import logs


@pytest.fixture
def configured(capsys: pytest.CaptureFixture[str]) -> Iterator[pytest.CaptureFixture[str]]:
    """Logging as a gpushare process configures it, writing to the test's captured stderr
    (configured in the test itself: capsys's stream is the one of the test's call); pytest's
    own handlers are put back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield capsys
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.reset_defaults()


def lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


def test_our_lines_and_every_librarys_are_json_with_the_same_keys(
    configured: pytest.CaptureFixture[str],
) -> None:
    logs.configure("info")
    logs.get("scheduler").info("pod_bound", pod="default/p", node="n", card=[0])
    logging.getLogger("kopf.objects").warning("Request attempt #1/9 failed; will retry")
    logging.getLogger("aiohttp.client").error("connection lost")
    ours, kopf, aiohttp = lines(configured)
    assert {k: ours[k] for k in ("component", "event", "level")} == {
        "component": "scheduler",
        "event": "pod_bound",
        "level": "info",
    }
    assert (ours["pod"], ours["node"], ours["card"]) == ("default/p", "n", [0])
    assert {k: kopf[k] for k in ("component", "event", "level")} == {
        "component": "kopf.objects",
        "event": "Request attempt #1/9 failed; will retry",
        "level": "warning",
    }
    assert aiohttp["component"] == "aiohttp.client"
    assert {"component", "event", "level", "timestamp"} <= ours.keys() & kopf.keys()


def test_one_level_filters_ours_and_the_libraries(
    configured: pytest.CaptureFixture[str],
) -> None:
    logs.configure("info")
    logs.get("scheduler").debug("held")
    logging.getLogger("kopf.activities").debug("handler succeeded")
    logging.getLogger("kopf.activities").info("handler started")
    assert [line["event"] for line in lines(configured)] == ["handler started"]


def test_a_library_exception_is_in_the_same_object(
    configured: pytest.CaptureFixture[str],
) -> None:
    logs.configure("info")
    try:
        raise ConnectionResetError("reset by peer")
    except ConnectionResetError:
        logging.getLogger("asyncio").exception("Task exception was never retrieved")
    (line,) = lines(configured)
    assert line["component"] == "asyncio"
    assert line["level"] == "error"
    assert "ConnectionResetError: reset by peer" in line["exception"]
