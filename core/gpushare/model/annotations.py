"""Reading and writing the volcano.sh/* annotations, byte-for-byte as Volcano does (their
names are in `contract`). Every reader of a pod's `gpu-assigned` and `predicate-time` is here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import NewType

from gpushare.model import contract
from gpushare.model.errors import InvalidAnnotation

CardIndex = NewType("CardIndex", int)
"""A card's index on its node, as NVML enumerates it and as `gpu-index` names it."""

_TIME_DIGITS = 25
"""`predicate-time` in seconds is read only below this many digits (int64 nanoseconds,
what Volcano writes, have at most 19)."""
_COUNT_DIGITS = 9
"""`gang-min-member` is read only up to this many digits: no count of pods is longer."""
_INDEX_LIST = re.compile(r"(?:0|[1-9][0-9]{0,5})(?:,(?:0|[1-9][0-9]{0,5}))*")


def parse_card_indices(value: str, *, key: str, owner: str) -> tuple[CardIndex, ...]:
    """Card indices of a comma list such as ``"0"`` or ``"0,5"``: canonical decimals, no
    spaces, no repeats (Volcano writes exactly this form); else InvalidAnnotation."""
    if _INDEX_LIST.fullmatch(value) is None:
        raise InvalidAnnotation(
            f"{owner}: annotation {key}={value!r} is not a comma list of card indices "
            f'such as "0" or "0,5"; correct or remove it'
        )
    indices = tuple(CardIndex(int(part)) for part in value.split(","))
    if len(set(indices)) != len(indices):
        raise InvalidAnnotation(
            f"{owner}: annotation {key}={value!r} names a card twice; correct or remove it"
        )
    return indices


def format_card_indices(indices: Iterable[CardIndex]) -> str:
    """The annotation value for `indices`: ``"3"`` or ``"0,5"``."""
    return ",".join(str(index) for index in indices)


def gpu_assigned(annotations: Mapping[str, str]) -> bool:
    """`gpu-assigned` is exactly ``"true"``: the kubelet has started the pod with its grant (the
    device plugin saw it admitted). Absent, ``"false"`` (what every Binding writes) or anything
    else: not yet."""
    return annotations.get(contract.GPU_ASSIGNED) == contract.GPU_ASSIGNED_TRUE


def predicate_time_ns(annotations: Mapping[str, str]) -> int | None:
    """`predicate-time`, the unix nanoseconds of the scheduling decision, when it is a
    decimal count (as Volcano and the operator write it); else None."""
    raw = annotations.get(contract.PREDICATE_TIME, "")
    if not raw.isdigit():
        return None
    try:
        return int(raw)
    except ValueError:  # digits int() does not read, such as "²"
        return None


def gang_min_member(annotations: Mapping[str, str]) -> int | None:
    """`gang-min-member`, the gang's minMember when the pod was bound, when it is a whole
    number of 1 or more in ASCII digits (`str.isdigit` takes others, which `int` refuses) and
    short (`int` refuses more than 4,300 digits); else None."""
    raw = annotations.get(contract.GANG_MIN_MEMBER, "")
    if not (raw.isascii() and raw.isdigit()) or len(raw) > _COUNT_DIGITS:
        return None
    return int(raw) or None


def predicate_time_s(annotations: Mapping[str, str]) -> float | None:
    """`predicate-time` in unix seconds; None when it is not a decimal count of fewer than
    25 digits (none longer is a time)."""
    if len(annotations.get(contract.PREDICATE_TIME, "")) >= _TIME_DIGITS:
        return None
    nanoseconds = predicate_time_ns(annotations)
    return None if nanoseconds is None else nanoseconds / 1e9
