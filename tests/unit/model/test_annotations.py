"""The one reading of a pod's `gpu-assigned` and `predicate-time` annotations."""

from __future__ import annotations

import pytest

from gpushare.model import contract
from gpushare.model.annotations import gpu_assigned, predicate_time_ns, predicate_time_s


@pytest.mark.parametrize(
    ("value", "assigned"),
    [(None, False), ("true", True), ("false", False), ("", False), ("True", False)],
)
def test_gpu_assigned_only_when_exactly_true(value: str | None, assigned: bool) -> None:
    annotations = {} if value is None else {contract.GPU_ASSIGNED: value}
    assert gpu_assigned(annotations) is assigned


@pytest.mark.parametrize(
    ("value", "nanoseconds"),
    [
        (None, None),
        ("", None),
        ("-1", None),
        ("1e9", None),
        ("²", None),
        ("1593764466550835304", 1593764466550835304),
    ],
)
def test_predicate_time_is_a_decimal_nanosecond_count(
    value: str | None, nanoseconds: int | None
) -> None:
    annotations = {} if value is None else {contract.PREDICATE_TIME: value}
    assert predicate_time_ns(annotations) == nanoseconds


def test_predicate_time_in_seconds_refuses_what_no_float_time_holds() -> None:
    assert predicate_time_s({contract.PREDICATE_TIME: "1500000000000000000"}) == 1.5e9
    assert predicate_time_s({contract.PREDICATE_TIME: "9" * 25}) is None
    assert predicate_time_ns({contract.PREDICATE_TIME: "9" * 25}) == int("9" * 25)
