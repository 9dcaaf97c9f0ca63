"""List-then-watch, as client-go's reflector does it: the one way gpushare reads a resource.

A LIST in pages, each object handed to the owner as its page arrives (so neither the raw
JSON nor the objects of a large cluster are ever held whole), then a WATCH from the list's
resourceVersion, resumed from the last version seen when the server ends it or the
connection breaks, and a new LIST only when that version has expired (410) or something
unforeseen went wrong. The owner sees two synchronous calls (each lands in one step between
awaits): `on_event` for every listed object and every watched change, in order, each as the
owner's `transform` made it, and `on_listed` when a LIST is complete, with the keys it held:
what the owner holds beyond them is gone.

The operator uses one per resource (nodes, GPUNodes, pods) instead of kopf's watches, whose
initial listing is not paged and keeps state per object: at 50,000 pods that alone cost
hundreds of MiB. The device plugin uses one for the pods bound to its node.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar, cast

import aiohttp

from gpushare import logs
from gpushare.kube.client import raw_json
from gpushare.kube.errors import ApiError, api_error
from gpushare.kube.retry import WATCH, wait_s

ListCall = Callable[..., Awaitable[object]]
"""A kubernetes_asyncio list method with its selectors bound (functools.partial)."""
Item = dict[str, Any]
T = TypeVar("T")

LISTED = "LISTED"
"""The event type `on_event` gets for each object of a LIST."""
DELETED = "DELETED"
MODIFIED = "MODIFIED"
PAGE_SIZE = 500  # client-go's pager uses the same
LIST_TIMEOUT_S = 300  # a LIST of a large cluster is slow
LIST_IDLE_S = 60.0
"""A page of a LIST that sends no byte this long is taken for a dead connection (a pooled one
gone half-open): the LIST starts over on another rather than wait out `LIST_TIMEOUT_S`."""
WATCH_S = 300
WATCH_IDLE_S = 90.0
"""A watch silent this long is taken for dead and opened again: the apiserver sends a bookmark
on a quiet watch every minute, so one half a minute late is a connection that went half-open
(a NAT or load balancer that lost its state sends no reset; without this, the owner would see
nothing until the watch's own end, `WATCH_S` later). Opened again for nothing, a watch costs
one call: it resumes from the last version seen."""
NOT_SERVED_S = 30.0
"""How often an optional resource the apiserver does not serve (a CRD not installed) is
looked for again."""
QUICK_END_S = 1.0
"""A watch the server ends sooner than this, with nothing in it, is retried after a pause."""


class WatchExpired(Exception):
    """The resourceVersion to watch or page from is too old (410): list again."""


def uid_of(item: Item) -> str:
    return str((item.get("metadata") or {}).get("uid") or "")


def name_of(item: Item) -> str:
    return str((item.get("metadata") or {}).get("name") or "")


async def list_pages(
    call: ListCall, *, page_size: int = PAGE_SIZE
) -> AsyncIterator[tuple[list[Item], str]]:
    """Each page of what `call` lists, with the list's resourceVersion (one snapshot: every
    page carries the same)."""
    token: str | None = None
    while True:
        page: dict[str, Any] = {
            "limit": page_size,
            "_preload_content": False,
            "_request_timeout": aiohttp.ClientTimeout(total=LIST_TIMEOUT_S, sock_read=LIST_IDLE_S),
        }
        if token:
            page["_continue"] = token
        try:
            listed = await raw_json(call(**page))
        except ApiError as error:
            if error.status == 410:  # the continue token expired mid-way
                raise WatchExpired(error.message) from error
            raise
        meta = listed.get("metadata") or {}
        items = [item for item in listed.get("items") or [] if isinstance(item, dict)]
        del listed
        yield items, str(meta.get("resourceVersion") or "")
        token = meta.get("continue")
        if not token:
            return


async def watch(
    call: ListCall, resource_version: str, *, idle_s: float = WATCH_IDLE_S
) -> AsyncIterator[tuple[str, Item]]:
    """(type, object) events after `resource_version` until the server ends the watch;
    WatchExpired when the version is too old, ApiError on any other refusal, TimeoutError
    (aiohttp's ServerTimeoutError) after `idle_s` without a byte."""
    response = cast(
        aiohttp.ClientResponse,
        await call(
            watch=True,
            allow_watch_bookmarks=True,
            resource_version=resource_version,
            timeout_seconds=WATCH_S,
            _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(total=WATCH_S + 30, sock_read=idle_s),
        ),
    )
    async with response:
        if response.status == 410:
            raise WatchExpired(await response.text())
        if response.status >= 300:
            raise api_error(response.status, response.headers, await response.read())
        async for line in _lines(response.content):
            event = json.loads(line)
            obj = event.get("object") if isinstance(event, dict) else None
            if not isinstance(obj, dict):
                raise ValueError(f"not a watch event: {line[:200]!r}")
            event_type = str(event.get("type"))
            if event_type == "ERROR":
                if obj.get("code") == 410:
                    raise WatchExpired(str(obj.get("message")))
                raise ApiError(int(obj.get("code") or 500), str(obj.get("message")))
            yield event_type, obj


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Whole lines of any length (aiohttp's own line reader refuses lines over 64 KiB,
    and one pod with a large annotation makes such a line)."""
    buffered = b""
    async for chunk in stream.iter_any():
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            if line.strip():
                yield line
    if buffered.strip():
        yield buffered


class Reflector(Generic[T]):
    """Keeps its owner current with one resource (a plural: pods, nodes...) for ever, until
    stopped."""

    def __init__(
        self,
        resource: str,
        call: ListCall,
        *,
        transform: Callable[[Item], T],
        on_event: Callable[[str, T], None],
        on_listed: Callable[[set[str], str], None],
        key: Callable[[Item], str] = uid_of,
        optional: bool = False,
        page_size: int = PAGE_SIZE,
        idle_s: float = WATCH_IDLE_S,
    ) -> None:
        """`transform(object)`: what the owner keeps of each object (parsed, or slimmed).
        `on_event(event type, transformed object)`: each object of a LIST (type LISTED) and
        each watched change. `on_listed(keys, resourceVersion)`: a LIST is complete and these
        were its objects' keys; whatever else the owner holds is gone. `optional`: a 404 (the
        resource's CRD is not installed) lists as empty, and the reflector looks again later.
        `idle_s`: how long a silent watch is trusted (`WATCH_IDLE_S`)."""
        self.resource = resource
        self._call = call
        self._on_event = on_event
        self._on_listed = on_listed
        self._key = key
        self._transform = transform
        self._optional = optional
        self._page_size = page_size
        self._idle_s = idle_s
        self.synced = asyncio.Event()
        """Set once the first LIST has been handed over."""
        self.listed_from = 0.0
        """When the last LIST began (monotonic): it holds every write the apiserver had taken
        by then (a LIST without a resourceVersion is a consistent read)."""
        self.count = 0
        """How many objects the last LIST held."""
        self._fresh = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = True
        self._log = logs.get("reflector", resource=resource)

    def start(self) -> None:
        """Run in a task of its own, until `stop`."""
        self._stopped = False
        self._fresh.clear()
        self._task = asyncio.create_task(self.run(), name=f"reflector {self.resource}")

    async def stop(self) -> None:
        """End the task; whoever waits in `relist` is let go."""
        self._stopped = True
        await self._end_task()
        self._fresh.set()

    async def _end_task(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def relist(self) -> None:
        """LIST again now (the watch may lag behind), and return once that list is in.
        Nothing to do before `start` (the first list is yet to come) or after `stop`."""
        if self._stopped:
            return
        try:
            await self._end_task()
        finally:  # even when the caller is cancelled: a reflector is never left stopped,
            # nor run twice (a relist that overlapped this one may have started it already)
            if not self._stopped and self._task is None:
                self.start()
        await self._fresh.wait()

    async def run(self) -> None:
        """List and watch for ever (cancel to stop); `start` runs it as a task of its own.
        Not `retry`: what a failure means (watch again, or LIST anew) depends on the error,
        and the delays start over after each LIST and each watch that delivered."""
        delays = WATCH.delays()
        version = ""  # none yet: LIST first
        while True:
            began = time.monotonic()
            try:
                if not version:
                    version = await self._list(began)
                    delays = WATCH.delays()
                opened, events = time.monotonic(), 0
                async for event_type, body in watch(self._call, version, idle_s=self._idle_s):
                    events += 1
                    version = str((body.get("metadata") or {}).get("resourceVersion") or version)
                    if event_type != "BOOKMARK":
                        self._deliver(event_type, body)
                if events or time.monotonic() - opened >= QUICK_END_S:
                    delays = WATCH.delays()
                else:  # ended at once: do not hammer the server
                    await self._back_off("watch ended at once", delays)
            except WatchExpired as expired:
                self._log.info("watch_expired", reason=str(expired))
                version = ""
            except ApiError as error:
                if error.status == 404 and self._optional:
                    self._log.info("not_served", error=error.message, retry_in_s=NOT_SERVED_S)
                    self._handed_over(set(), "", began)
                    version = ""
                    await asyncio.sleep(NOT_SERVED_S)
                    continue
                await self._back_off(error, delays)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as error:
                # The apiserver restarting, a dropped connection, a cut-off stream: watch
                # again from the last version seen (a LIST, if that is where it broke).
                await self._back_off(error, delays)
            except Exception as error:  # a bug must not freeze the owner's view: LIST anew
                version = ""
                await self._back_off(error, delays, unforeseen=True)

    async def _list(self, began: float) -> str:
        """Hand over every listed object as its page arrives (never the whole list at once:
        each page's memory is free again before the next, so a large cluster does not
        leave the heap fragmented), then the keys; returns the version to watch from."""
        keys: set[str] = set()
        version = ""
        async for items, page_version in list_pages(self._call, page_size=self._page_size):
            version = page_version
            for item in items:
                keys.add(self._key(item))
                self._deliver(LISTED, item)
            del items
        self._handed_over(keys, version, began)
        return version

    def _deliver(self, event_type: str, body: Item) -> None:
        """One object to the owner. A failure there is a bug for one object, logged with
        it; the others (and the watch) go on, as an informer's do."""
        try:
            self._on_event(event_type, self._transform(body))
        except Exception:
            self._log.exception("apply_failed", type=event_type, object=self._key(body))

    def _handed_over(self, keys: set[str], version: str, began: float) -> None:
        try:
            self._on_listed(keys, version)
        except Exception:
            self._log.exception("listed_failed", objects=len(keys))
        self.count = len(keys)
        self.listed_from = began
        self._fresh.set()
        self.synced.set()

    async def _back_off(
        self, error: Exception | str, delays: Iterator[float], *, unforeseen: bool = False
    ) -> None:
        delay = wait_s(next(delays), error if isinstance(error, Exception) else None)
        reason = error if isinstance(error, str) else str(error) or type(error).__name__
        self._log.warning("watch_failed", error=reason, retry_in_s=delay, exc_info=unforeseen)
        await asyncio.sleep(delay)
