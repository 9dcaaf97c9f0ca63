"""The one backoff and retry every retry loop uses: its delays, its attempt count, which
errors it tries again, and a wait that a stop event cuts short."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from gpushare.kube.retry import Backoff, pause, retry

NO_WAIT = Backoff(initial_s=0.0, max_s=0.0)


def test_delays_grow_by_the_factor_up_to_the_maximum() -> None:
    assert list(Backoff(initial_s=0.25, max_s=2.0).delays(7)) == [
        0.25, 0.5, 1.0, 2.0, 2.0, 2.0, 2.0
    ]  # fmt: skip
    assert list(Backoff(initial_s=2.0, max_s=2.0).delays(3)) == [2.0, 2.0, 2.0]


def test_delays_go_on_for_ever_without_a_count_and_start_over_on_each_call() -> None:
    backoff = Backoff(initial_s=0.5, max_s=30.0)
    assert list(itertools.islice(backoff.delays(), 8))[-1] == 30.0
    assert next(backoff.delays()) == 0.5


def test_jitter_spreads_each_delay_within_its_share() -> None:
    delays = list(Backoff(initial_s=1.0, max_s=1.0, jitter=0.1).delays(200))
    assert all(0.9 <= delay <= 1.1 for delay in delays)
    assert len(set(delays)) > 1


def test_a_backoff_that_would_shrink_is_refused() -> None:
    with pytest.raises(ValueError, match="factor"):
        Backoff(initial_s=1.0, max_s=2.0, factor=0.5)


@pytest.mark.asyncio
async def test_retry_calls_again_while_the_error_is_retryable() -> None:
    answers: list[object] = [TimeoutError("slow"), TimeoutError("slow"), "answer"]
    seen: list[tuple[int, str, float]] = []

    async def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    result = await retry(
        call,
        retryable=lambda error: isinstance(error, TimeoutError),
        backoff=NO_WAIT,
        attempts=5,
        on_retry=lambda attempt, error, delay: seen.append((attempt, str(error), delay)),
    )
    assert result == "answer"
    assert seen == [(1, "slow", 0.0), (2, "slow", 0.0)]


async def calls_until_raised(error: Exception) -> int:
    """How many calls `retry` makes (3 attempts, TimeoutError retried) of a call that
    always raises `error`, which it must raise in the end."""
    calls = 0

    async def failing() -> None:
        nonlocal calls
        calls += 1
        raise error

    with pytest.raises(type(error)):
        await retry(
            failing,
            retryable=lambda error: isinstance(error, TimeoutError),
            backoff=NO_WAIT,
            attempts=3,
        )
    return calls


@pytest.mark.asyncio
async def test_retry_raises_the_last_error_after_the_attempts_and_others_at_once() -> None:
    assert await calls_until_raised(TimeoutError()) == 3
    assert await calls_until_raised(KeyError()) == 1


@pytest.mark.asyncio
async def test_pause_ends_early_when_stopped() -> None:
    stop = asyncio.Event()
    assert await pause(0.01, stop) is False
    assert await pause(0.0) is False
    asyncio.get_running_loop().call_later(0.01, stop.set)
    assert await asyncio.wait_for(pause(60, stop), 5) is True
