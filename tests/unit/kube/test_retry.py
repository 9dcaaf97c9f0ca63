"""The one retry home every retry loop uses: its delays, its attempt count, which errors it
tries again, the apiserver's Retry-After, and a wait that a stop event cuts short."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from gpushare.kube import ApiError, ApiUnreachable
from gpushare.kube.errors import api_error
from gpushare.kube.retry import (
    RETRY_AFTER_MAX_S,
    Backoff,
    RetryPolicy,
    pause,
    retry,
    transient,
    wait_s,
)

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
        RetryPolicy("test", NO_WAIT, attempts=5),
        retryable=lambda error: isinstance(error, TimeoutError),
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
            RetryPolicy("test", NO_WAIT, attempts=3),
            retryable=lambda error: isinstance(error, TimeoutError),
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


@pytest.mark.parametrize(
    ("error", "worth_it"),
    [
        (ApiError(429, "too many requests"), True),
        (ApiError(500, "etcd"), True),
        (ApiError(503, "storage is (re)initializing"), True),
        (ApiUnreachable("reset"), True),
        (TimeoutError(), True),
        (ApiError(403, "forbidden"), False),
        (ApiError(409, "conflict"), False),
        (ApiError(422, "invalid"), False),
        (KeyError("a bug"), False),
    ],
)
def test_only_errors_that_may_pass_as_they_are_are_tried_again(
    error: Exception, worth_it: bool
) -> None:
    assert transient(error) is worth_it


def test_the_apiservers_retry_after_is_honoured_from_its_header_or_its_status() -> None:
    header = api_error(429, {"Retry-After": "3"}, b'{"message": "slow down"}')
    assert header.message == "slow down"
    assert wait_s(0.5, header) == 3.0
    assert wait_s(5.0, header) == 5.0  # never shorter than the policy's own delay
    body = b'{"message": "storage is (re)initializing", "details": {"retryAfterSeconds": 2}}'
    assert wait_s(0.5, api_error(503, {}, body)) == 2.0
    assert wait_s(0.5, api_error(429, {"Retry-After": "86400"}, b"")) == RETRY_AFTER_MAX_S
    assert wait_s(0.5, api_error(503, {"Retry-After": "soon"}, b"")) == 0.5
    assert wait_s(0.5, TimeoutError()) == 0.5


@pytest.mark.asyncio
async def test_retry_waits_what_the_apiserver_asked() -> None:
    answers: list[object] = [api_error(429, {"Retry-After": "0"}, b""), "answer"]
    seen: list[float] = []

    async def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    policy = RetryPolicy("test", Backoff(initial_s=0.0, max_s=0.0), attempts=2)
    assert await retry(call, policy, on_retry=lambda _a, _e, delay: seen.append(delay)) == "answer"
    assert seen == [0.0]
