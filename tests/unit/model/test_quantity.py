"""GPU quantities as users write them and as the apiserver returns them."""

from __future__ import annotations

import pytest

from gpushare.model import InvalidQuantity, contract, parse_quantity


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1024", 1024),
        (1024, 1024),
        ("0", 0),
        ("+7", 7),
        ("2k", 2000),  # the apiserver's canonical form of 2000
        ("12k", 12000),
        ("1.5k", 1500),
        ("1e3", 1000),
        ("1E3", 1000),
        ("3M", 3_000_000),
        ("0E", 0),  # the exa suffix, not an exponent without digits
    ],
    ids=repr,
)
def test_whole_quantities_are_read_in_devices(raw: object, expected: int) -> None:
    assert parse_quantity(raw, resource=contract.GPU_MEMORY, owner="pod d/p") == expected


@pytest.mark.parametrize(
    ("raw", "hint"),
    [
        ("1.5", "not a whole number"),
        ("500m", "not a whole number"),
        ("-1", "negative"),
        (-1, "negative"),
        ("abc", "not a Kubernetes quantity"),
        ("1Gi", "binary suffix"),
        ("10^12", "not a Kubernetes quantity"),
        ("", "not a Kubernetes quantity"),
        (" 1", "not a Kubernetes quantity"),
        ("1e400", "out of range"),
        ("99999999999999999999", "larger than Kubernetes allows"),
        (1.5, "not a quantity"),
        (True, "not a quantity"),
        (None, "not a quantity"),
    ],
    ids=repr,
)
def test_bad_quantities_are_refused_with_the_owner_and_the_fix(raw: object, hint: str) -> None:
    with pytest.raises(InvalidQuantity) as caught:
        parse_quantity(raw, resource=contract.GPU_MEMORY, owner="pod d/p container c")
    message = str(caught.value)
    assert hint in message
    assert "pod d/p container c" in message
    assert contract.GPU_MEMORY in message
