"""Kubernetes timestamps, written and read in one place."""

from __future__ import annotations

import pytest

from gpushare.kube.clock import micro_time, parse_time, rfc3339


def test_the_two_forms_kubernetes_writes() -> None:
    assert rfc3339(1_593_764_466.55) == "2020-07-03T08:21:06Z"
    assert micro_time(1_593_764_466.55) == "2020-07-03T08:21:06.550000Z"


def test_now_round_trips_to_the_second() -> None:
    written = rfc3339()
    parsed = parse_time(written)
    assert parsed is not None
    assert rfc3339(parsed) == written


@pytest.mark.parametrize("raw", [None, 3, "", "yesterday", "2020-13-01T00:00:00Z"])
def test_what_is_not_a_time_reads_as_none(raw: object) -> None:
    assert parse_time(raw) is None


def test_both_forms_read_back() -> None:
    assert parse_time("2020-07-03T08:21:06Z") == 1_593_764_466.0
    assert parse_time("2020-07-03T08:21:06.550000Z") == pytest.approx(1_593_764_466.55)
