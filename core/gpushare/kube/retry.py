"""Trying again, written once: how long to wait between tries (`Backoff`), one call tried
until it answers (`retry`), and a wait that a stop event cuts short (`pause`).

Every loop of gpushare that tries something again uses these: the reflector, the scheduler's
bind, the scheduling queue's backoff, the CLI's reads, the device plugin's `gpu-assigned`
write, its serving loop and its first inventory publication. Each keeps its own delays,
attempt count and log lines; only the arithmetic and the waiting live here.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

_T = TypeVar("_T")

FACTOR = 2.0
"""Each delay is this many times the one before (until the maximum)."""
_MAX_EXPONENT = 64


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays between tries: `initial_s` first, then `factor` times the one before, never
    more than `max_s`; each one spread by up to ± `jitter` of itself (0, the default: exact).
    A fixed interval is `Backoff(s, s)`."""

    initial_s: float
    max_s: float
    factor: float = FACTOR
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(f"{self}: the factor must be >= 1 and the jitter within [0, 1]")

    def delays(self, count: int | None = None) -> Iterator[float]:
        """The delays in turn: `count` of them, or for ever. A new call starts over (what a
        loop does after a success)."""
        for attempt in itertools.count(1) if count is None else range(1, count + 1):
            yield self.delay(attempt)

    def delay(self, attempt: int) -> float:
        """The delay after failed try number `attempt` (1 for the first)."""
        # The exponent stops growing once the maximum is reached (a float power overflows).
        growth = self.factor ** min(attempt - 1, _MAX_EXPONENT) if self.factor > 1 else 1.0
        return self._spread(min(self.initial_s * growth, self.max_s))

    def _spread(self, delay: float) -> float:
        if not self.jitter:
            return delay
        return delay * (1 + random.uniform(-self.jitter, self.jitter))  # noqa: S311  # not a secret


async def retry(
    call: Callable[[], Awaitable[_T]],
    *,
    retryable: Callable[[Exception], bool],
    backoff: Backoff,
    attempts: int | None = None,
    on_retry: Callable[[int, Exception, float], None] | None = None,
) -> _T:
    """`call()`'s answer, calling again after the next delay of `backoff` while it raises an
    error that is `retryable`, up to `attempts` calls in all (None: for ever). Any other error,
    or the last attempt's, is raised as it is. `on_retry(attempt, error, delay)` is told of
    each failure that is tried again, before the wait (to log it)."""
    delays = backoff.delays(None if attempts is None else attempts - 1)
    for attempt in itertools.count(1):
        try:
            return await call()
        except Exception as error:
            delay = next(delays, None) if retryable(error) else None
            if delay is None:
                raise
            if on_retry is not None:
                on_retry(attempt, error, delay)
        await asyncio.sleep(delay)
    raise AssertionError("unreachable: itertools.count never ends")


async def pause(seconds: float, stop: asyncio.Event | None = None) -> bool:
    """Wait `seconds`, or less when `stop` is set meanwhile; whether `stop` is set."""
    if stop is None:
        await asyncio.sleep(seconds)
        return False
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
