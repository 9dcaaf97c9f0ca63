"""The reflector's recovery, each against a scripted apiserver answer that a real one gives
only under faults: a watch cut off mid-stream, an expired version, a malformed event, an
unforeseen failure, a relist interrupted half-way, and relists that overlap; and a LIST dated
from when it was asked. (Paging, large events, missed deletions and missing CRDs are proven
against the real apiserver in the integration suite.)"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from gpushare.kube import reflector as reflector_module
from gpushare.kube.reflector import Reflector, name_of
from gpushare.kube.retry import Backoff, RetryPolicy

pytestmark = pytest.mark.asyncio


class Answer:
    """One HTTP response: a body, optionally cut off by a connection error at its end."""

    def __init__(self, status: int, body: bytes, cut: Exception | None = None) -> None:
        self.status = status
        self._body = body
        self._cut = cut
        self.content = self

    async def __aenter__(self) -> Answer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def read(self) -> bytes:
        return self._body

    async def iter_any(self) -> AsyncIterator[bytes]:
        yield self._body
        if self._cut is not None:
            raise self._cut


class Apiserver:
    """Each LIST takes the next scripted list answer, each WATCH the next watch answer;
    with none left, a request hangs as an idle watch does."""

    def __init__(self, lists: list[Answer | Exception], watches: list[Answer]) -> None:
        self._answers = {False: list(lists), True: list[Answer | Exception](watches)}
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, **params: Any) -> Answer:
        self.requests.append(params)
        answers = self._answers[bool(params.get("watch"))]
        if not answers:
            await asyncio.Event().wait()
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def watched_from(self) -> list[str]:
        return [request["resource_version"] for request in self.requests if request.get("watch")]

    def lists(self) -> int:
        return sum(not request.get("watch") for request in self.requests)


def pod(name: str, version: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": name, "resourceVersion": str(version)}}


def listing(version: int, *names: str) -> Answer:
    items = [pod(name, version) for name in names]
    body = {"metadata": {"resourceVersion": str(version)}, "items": items}
    return Answer(200, json.dumps(body).encode())


def events(*changes: tuple[str, str, int] | bytes, cut: Exception | None = None) -> Answer:
    lines = [
        change
        if isinstance(change, bytes)
        else json.dumps({"type": change[0], "object": pod(change[1], change[2])}).encode()
        for change in changes
    ]
    return Answer(200, b"\n".join(lines) + b"\n", cut)


class Owner:
    def __init__(self) -> None:
        self.held: set[str] = set()
        self.lists = 0

    def apply(self, event_type: str, body: dict[str, Any]) -> None:
        (self.held.discard if event_type == "DELETED" else self.held.add)(name_of(body))

    def listed(self, names: set[str], version: str) -> None:
        self.lists += 1
        self.held &= names


async def until(holds: Callable[[], bool]) -> None:
    for _ in range(500):
        if holds():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within 5 s")


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reflector_module, "WATCH", RetryPolicy("watch", Backoff(0.01, 30.0)))


async def reflecting(apiserver: Apiserver, owner: Owner) -> Reflector[dict[str, Any]]:
    reflector = Reflector(
        "pods", apiserver, transform=dict, on_event=owner.apply, on_listed=owner.listed, key=name_of
    )
    reflector.start()
    await until(reflector.synced.is_set)
    return reflector


async def test_a_watch_cut_off_resumes_from_the_last_version_seen_without_listing_again() -> None:
    apiserver = Apiserver(
        [listing(10, "a")],
        [
            events(("ADDED", "b", 11), cut=aiohttp.ClientPayloadError("connection reset")),
            events(("DELETED", "a", 12)),
        ],
    )
    owner = Owner()
    reflector = await reflecting(apiserver, owner)
    await until(lambda: owner.held == {"b"})
    await until(lambda: len(apiserver.watched_from()) == 3)
    await reflector.stop()
    assert (owner.lists, apiserver.lists()) == (1, 1)
    assert apiserver.watched_from() == ["10", "11", "12"]


async def test_an_expired_version_lists_again_and_forgets_what_is_gone() -> None:
    apiserver = Apiserver(
        [listing(10, "a"), listing(20, "b")],
        [Answer(410, b'{"kind":"Status","code":410,"message":"too old resource version"}')],
    )
    owner = Owner()
    reflector = await reflecting(apiserver, owner)
    await until(lambda: owner.lists == 2)
    await reflector.stop()
    assert owner.held == {"b"}


async def test_a_malformed_event_is_refused_and_the_watch_resumes_where_it_was() -> None:
    apiserver = Apiserver(
        [listing(10, "a")],
        [
            events(b'{"type":"ADDED","object":null}'),
            events(b"[]"),
            events(("ADDED", "b", 11)),
        ],
    )
    owner = Owner()
    reflector = await reflecting(apiserver, owner)
    await until(lambda: owner.held == {"a", "b"})
    await reflector.stop()
    assert owner.lists == 1
    assert apiserver.watched_from()[:3] == ["10"] * 3


async def test_an_unforeseen_failure_is_logged_and_the_reflector_lists_again() -> None:
    apiserver = Apiserver([RuntimeError("a bug"), listing(10, "a")], [])
    owner = Owner()
    reflector = await reflecting(apiserver, owner)
    await reflector.stop()
    assert owner.held == {"a"}


async def test_a_relist_interrupted_half_way_leaves_the_reflector_running() -> None:
    apiserver = Apiserver([listing(10, "a"), listing(20, "a", "b")], [])
    owner = Owner()
    reflector = await reflecting(apiserver, owner)
    relist = asyncio.create_task(reflector.relist())
    await asyncio.sleep(0)  # in the middle of ending the old task
    relist.cancel()
    await until(lambda: owner.held == {"a", "b"})
    await reflector.stop()
    await reflector.relist()  # once stopped, a relist starts nothing
    assert apiserver.lists() == 2


class SlowToEnd(Apiserver):
    """A watch that takes a few turns of the loop to end once cancelled (its connection
    closing), as a real one does."""

    async def __call__(self, **params: Any) -> Answer:
        if not params.get("watch"):
            return await super().__call__(**params)
        try:
            await asyncio.Event().wait()
        finally:
            for _ in range(5):
                await asyncio.sleep(0)
        raise AssertionError("unreachable")


async def test_relists_that_overlap_leave_one_reflector_running_and_none_once_stopped() -> None:
    apiserver = SlowToEnd([listing(10, "a"), listing(20, "a"), listing(30, "a")], [])
    owner = Owner()
    reflector = await reflecting(apiserver, owner)
    first = asyncio.create_task(reflector.relist())
    await asyncio.sleep(0)  # ending the old watch, which takes a few turns
    first.cancel()  # a newer relist gives this one up (the plugin's late Allocates do)
    await reflector.relist()
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.sleep(0.05)
    await reflector.stop()
    left = [
        task
        for task in asyncio.all_tasks()
        if task.get_name() == "reflector pods" and not task.done()
    ]
    assert left == []


async def test_a_list_dates_from_when_it_was_asked_not_when_its_answer_came() -> None:
    # A new leader trusts a LIST only if it began after its leadership: one asked before and
    # answered after may lack what the leader before wrote in between.
    apiserver, owner = Apiserver([listing(10, "a")], []), Owner()
    asked: list[float] = []
    answer = asyncio.Event()

    async def slow_to_answer_lists(**params: Any) -> Answer:
        if not params.get("watch"):
            asked.append(time.monotonic())
            await answer.wait()
        return await apiserver(**params)

    reflector = Reflector(
        "pods",
        slow_to_answer_lists,
        transform=dict,
        on_event=owner.apply,
        on_listed=owner.listed,
        key=name_of,
    )
    reflector.start()
    await until(lambda: bool(asked))
    await asyncio.sleep(0.1)
    answered = time.monotonic()
    answer.set()
    await until(reflector.synced.is_set)
    await reflector.stop()
    assert owner.held == {"a"}
    assert reflector.listed_from <= asked[0] < answered
