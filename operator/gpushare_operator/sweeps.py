"""Sweeps over every node that run on the event loop beside the binds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import TypeVar

SWEEP_SLICE = 128
"""Items a sweep takes between two turns of the event loop: the GPUNode status sweep over
5,000 nodes held it for 0.32 s every interval, and the binds waited behind it."""

_Item = TypeVar("_Item")


async def in_slices(items: Iterable[_Item]) -> AsyncIterator[_Item]:
    """Each of `items`, giving the event loop a turn before every `SWEEP_SLICE`-th."""
    for position, item in enumerate(items):
        if position % SWEEP_SLICE == 0:
            await asyncio.sleep(0)
        yield item
