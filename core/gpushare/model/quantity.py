"""Kubernetes quantities of the two GPU resources: whole, non-negative numbers only.

The apiserver stores quantities in canonical form, so a limit written as ``2000`` comes back
as ``"2k"`` and ``12000`` as ``"12k"``; decimal suffixes and exponents that denote a whole
number are therefore accepted. Binary suffixes (``1Gi``) are refused: the unit is one device
(MiB times the memory factor), and ``1Gi`` almost always means "1 GiB" written in bytes.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Final

from gpushare.model.errors import InvalidQuantity

# Kubernetes' own limit: quantities are int64 underneath.
MAX_QUANTITY: Final = 2**63 - 1

_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[eE][+-]?[0-9]+|[mkMGTPE]?)"
)
_DECIMAL_SUFFIX: Final = {"m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIXES: Final = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def parse_quantity(value: object, *, resource: str, owner: str) -> int:
    """The whole number of GPU devices `value` denotes, or InvalidQuantity naming `owner`
    (e.g. ``pod default/p container main``) and the fix."""
    where = f"{owner}: {resource} {value!r}"
    if isinstance(value, str) and _suffix(value) in _BINARY_SUFFIXES:
        raise InvalidQuantity(
            f"{where} uses a binary suffix; GPU resources count whole devices "
            f"(MiB times the memory factor for gpu-memory, cards for gpu-number), "
            f"so write a plain number such as 1024"
        )
    amount = parse_decimal(value, where=where)
    if amount != amount.to_integral_value():
        raise InvalidQuantity(
            f"{where} is not a whole number; GPU resources cannot be split below one device"
        )
    return int(amount)


def parse_decimal(value: object, *, where: str) -> Decimal:
    """Any Kubernetes quantity (``500m``, ``4Gi``, ``2k``, ``1e3``, 3) as an exact, non-negative
    Decimal, or InvalidQuantity starting with `where`."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidQuantity(f"{where} is not a quantity; write a number such as 1024")
    if isinstance(value, int):
        amount = Decimal(value)
    else:
        match = _QUANTITY.fullmatch(value)
        if match is None:
            raise InvalidQuantity(
                f"{where} is not a Kubernetes quantity; write a number such as 1024"
            )
        suffix = match["suffix"]
        if suffix in _BINARY_SUFFIXES:
            multiplier = Decimal(1024) ** (_BINARY_SUFFIXES.index(suffix) + 1)
            amount = Decimal(match["number"]) * multiplier
        else:
            # `E` alone is the exa suffix; with digits after it, an exponent.
            exponent = _DECIMAL_SUFFIX[suffix] if suffix in _DECIMAL_SUFFIX else int(suffix[1:])
            if abs(exponent) > 30:
                raise InvalidQuantity(f"{where} is out of range; write a number such as 1024")
            amount = Decimal(match["number"]).scaleb(exponent)
    if amount < 0:
        raise InvalidQuantity(f"{where} is negative; write a number of at least 0")
    if amount > MAX_QUANTITY:
        raise InvalidQuantity(f"{where} is larger than Kubernetes allows (2^63-1)")
    return amount


def _suffix(raw: str) -> str | None:
    match = _QUANTITY.fullmatch(raw)
    return match["suffix"] if match else None
