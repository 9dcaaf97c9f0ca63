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
_BINARY_SUFFIXES: Final = frozenset({"Ki", "Mi", "Gi", "Ti", "Pi", "Ei"})


def parse_quantity(value: object, *, resource: str, owner: str) -> int:
    """The whole number `value` denotes, or InvalidQuantity naming `owner` and the fix.

    `owner` is how the message names where the value came from, e.g.
    ``pod default/p container main``.
    """
    where = f"{owner}: {resource} {value!r}"
    if isinstance(value, bool):
        raise InvalidQuantity(f"{where} is not a quantity; write a whole number such as 1024")
    if isinstance(value, int):
        amount = value
    elif isinstance(value, str):
        amount = _parse_text(value, where)
    else:
        raise InvalidQuantity(f"{where} is not a quantity; write a whole number such as 1024")
    if amount < 0:
        raise InvalidQuantity(f"{where} is negative; write a whole number of at least 0")
    if amount > MAX_QUANTITY:
        raise InvalidQuantity(f"{where} is larger than Kubernetes allows (2^63-1)")
    return amount


def _parse_text(raw: str, where: str) -> int:
    match = _QUANTITY.fullmatch(raw)
    if match is None:
        raise InvalidQuantity(
            f"{where} is not a Kubernetes quantity; write a whole number such as 1024"
        )
    suffix = match["suffix"]
    if suffix in _BINARY_SUFFIXES:
        raise InvalidQuantity(
            f"{where} uses a binary suffix; GPU resources count whole devices "
            f"(MiB times the memory factor for gpu-memory, cards for gpu-number), "
            f"so write a plain number such as 1024"
        )
    exponent = int(suffix[1:]) if suffix[:1] in ("e", "E") else _DECIMAL_SUFFIX[suffix]
    if abs(exponent) > 30:
        raise InvalidQuantity(f"{where} is out of range; write a whole number such as 1024")
    amount = Decimal(match["number"]).scaleb(exponent)
    if amount != amount.to_integral_value():
        raise InvalidQuantity(
            f"{where} is not a whole number; GPU resources cannot be split below one device"
        )
    return int(amount)
