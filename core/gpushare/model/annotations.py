"""Reading and writing the volcano.sh/* annotations, byte-for-byte as Volcano does."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NewType

from gpushare.model.errors import InvalidAnnotation

CardIndex = NewType("CardIndex", int)
"""A card's index on its node, as NVML enumerates it and as `gpu-index` names it."""

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
