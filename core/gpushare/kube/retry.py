"""Trying again, in one place: which failures are worth another try (`transient`), how long to
wait before it (`RetryPolicy`, at least what the apiserver asked: `wait_s`), the named
policies every loop of gpushare uses, one call tried until it answers (`retry`), and a wait
that a stop event cuts short (`pause`).

The policies, by what is tried again:

| policy | for | delays | tries |
| --- | --- | --- | --- |
| `bind_policy(...)` | the scheduler's Binding | the live backoff settings | 5 |
| `WRITE` | Events, PodScheduled, evictions, `gpu-assigned` | 0.5 s to 4 s | 5 |
| `LABEL` | the operator's GPU pod label on a pod made without it | 0.5 s to 30 s | until done |
| `READ` | the CLI's reads | 0.25 s to 2 s | 8 |
| `KUBELET_RECORDS` | the plugin asking the kubelet which pod it is admitting | 5 ms to 0.16 s | 7 |
| `PUBLISH` | written once before serving: GPUNode, webhook Secret | 0.5 s to 5 s | until done |
| `REGISTER` | the device plugin's sockets and registration | 1 s to 30 s | until done |
| `WATCH` | a reflector's LIST and WATCH | 0.5 s to 30 s | until done |

A loop whose failures have outcomes of their own (a refused bind requeues the pod, an expired
watch lists anew) keeps its loop, and takes its delays and its `transient` from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from gpushare.kube.errors import ApiError

_T = TypeVar("_T")

FACTOR = 2.0
"""Each delay is this many times the one before (until the maximum)."""
_MAX_EXPONENT = 64
RETRY_AFTER_MAX_S = 60.0
"""The longest a Retry-After is honoured: an apiserver asking for more is waited for this."""


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


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How one kind of call is tried again: the delays between tries, and how many tries in
    all (None: until it succeeds)."""

    name: str
    backoff: Backoff
    attempts: int | None = None

    def delays(self) -> Iterator[float]:
        """The delay before each try after the first: `attempts - 1` of them, or for ever."""
        return self.backoff.delays(None if self.attempts is None else self.attempts - 1)


BIND_ATTEMPTS = 5
WRITE = RetryPolicy("write", Backoff(0.5, 4.0), attempts=5)
"""About 7 s of tries: an apiserver restarting is ridden out, a pod never left without its
report (the device plugin queues a `gpu-assigned` again after it)."""
READ = RetryPolicy("read", Backoff(0.25, 2.0), attempts=8)
"""About 10 s: an apiserver starting or overloaded."""
KUBELET_RECORDS = RetryPolicy("kubelet-records", Backoff(0.005, 0.16), attempts=7)
"""Reading the kubelet's pod-resources records during an Allocate or GetPreferredAllocation:
it answers 100 calls a second in bursts of 10 (a token comes back every 10 ms), shared with
its other clients; about 0.3 s of tries."""
LABEL = RetryPolicy("label", Backoff(0.5, 30.0))
"""Until done: a pod made before gpushare labelled GPU pods may see no other event for days,
and until labelled its placement is not guarded (the labeller's queue waits behind it: the
failures tried again are the apiserver's, which every pod would meet)."""
PUBLISH = RetryPolicy("publish", Backoff(0.5, 5.0))
REGISTER = RetryPolicy("register", Backoff(1.0, 30.0))
WATCH = RetryPolicy("watch", Backoff(0.5, 30.0))


def bind_policy(initial_s: float, max_s: float) -> RetryPolicy:
    """The Binding's: the operator's live backoff settings (`--backoff-initial`, `-max`)."""
    return RetryPolicy("bind", Backoff(initial_s, max_s), attempts=BIND_ATTEMPTS)


def transient(error: BaseException) -> bool:
    """Whether a call that failed with `error` may succeed if made again as it was: no answer
    came (an OSError, a timeout), or the apiserver asked to wait (429) or failed (5xx)."""
    if isinstance(error, ApiError):
        return error.status == 429 or error.status >= 500
    return isinstance(error, OSError | TimeoutError)


def wait_s(delay: float, error: BaseException | None) -> float:
    """How long to wait before the next try: the policy's `delay`, or longer when the
    apiserver asked for it (Retry-After, up to `RETRY_AFTER_MAX_S`)."""
    asked = error.retry_after_s if isinstance(error, ApiError) else None
    return delay if asked is None else max(delay, min(asked, RETRY_AFTER_MAX_S))


async def retry(
    call: Callable[[], Awaitable[_T]],
    policy: RetryPolicy,
    *,
    retryable: Callable[[Exception], bool] = transient,
    on_retry: Callable[[int, Exception, float], None] | None = None,
) -> _T:
    """`call()`'s answer, calling again after `policy`'s next delay (or the apiserver's
    Retry-After) while it raises an error that is `retryable`, up to the policy's tries. Any
    other error, or the last try's, is raised as it is. `on_retry(attempt, error, delay)` is
    told of each failure that is tried again, before the wait (to log it)."""
    delays = policy.delays()
    for attempt in itertools.count(1):
        try:
            return await call()
        except Exception as error:
            delay = next(delays, None) if retryable(error) else None
            if delay is None:
                raise
            delay = wait_s(delay, error)
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
