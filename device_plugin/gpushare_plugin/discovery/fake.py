"""Cards from a spec, for machines without GPUs (development, tests, the demo).

A spec is either inline, ``8x11178`` or ``2x81920,1x40960`` (count x MiB, comma separated), or
``@/path/cards.yaml``, a file that lists cards one by one::

    cards:
      - {memoryMiB: 81920, model: NVIDIA A100-SXM4-80GB, numaNode: 0}
      - {memoryMiB: 40960, xid: 79}     # this card has failed with XID 79

The file is read again whenever it changes, which is how a card fails and recovers at run
time: setting `xid` raises that XID once (the card turns Unhealthy unless the XID is an
application error), and the card fails its probe until `xid` is removed, after which the
health rules let it recover. UUIDs are derived from the node name and index unless given.

The file may also list what processes hold on the cards, as NVML would report them (pids of
the node's real processes: the tests' containers), for the usage measurement::

    processes:
      - {pid: 4711, card: 0, usedMiB: 1500}
"""

from __future__ import annotations

import re
import threading
import time
import uuid as uuidlib
from pathlib import Path

import yaml

from gpushare.model.annotations import CardIndex
from gpushare.model.bodies import mapping, sequence, text
from gpushare_plugin.discovery.base import (
    CardProcess,
    DiscoveredCard,
    DiscoveryError,
    Processes,
    XidEvent,
)

_INLINE = re.compile(r"\s*([1-9][0-9]{0,2})\s*x\s*([1-9][0-9]{0,7})\s*")
_POLL_S = 0.1


class FakeDiscovery:
    def __init__(self, spec: str, *, node: str) -> None:
        self._node = node
        self._file = Path(spec[1:]) if spec.startswith("@") else None
        self._inline = None if self._file else spec
        self._stamp: float | None = None
        self._cards: list[DiscoveredCard] = []
        self._xids: dict[str, int] = {}
        self._pending: list[XidEvent] = []
        self._processes: list[CardProcess] = []
        self._lock = threading.Lock()  # the health watch and the usage measurement both read
        self._reload(initial=True)

    def _uuid(self, index: int) -> str:
        return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f'{self._node}.{index}.gpushare')}"

    def _reload(self, *, initial: bool = False) -> None:
        with self._lock:
            self._reload_locked(initial=initial)

    def _reload_locked(self, *, initial: bool) -> None:
        if self._file is None:
            assert self._inline is not None
            self._cards = self._parse_inline(self._inline)
            return
        try:
            stamp = self._file.stat().st_mtime
            if stamp == self._stamp:
                return
            raw = yaml.safe_load(self._file.read_text())
        except (OSError, yaml.YAMLError) as error:
            if initial:
                raise DiscoveryError(f"fake GPU spec {self._file}: {error}") from error
            return  # a half-written file: keep the last good one, read it again later
        self._stamp = stamp
        cards, xids = self._parse_file(raw)
        self._processes = self._parse_processes(raw)
        if initial:
            self._cards = cards
        for uuid, xid in xids.items():
            if self._xids.get(uuid) != xid:
                self._pending.append(XidEvent(uuid=uuid, xid=xid))
        self._xids = xids

    def _parse_inline(self, spec: str) -> list[DiscoveredCard]:
        cards: list[DiscoveredCard] = []
        for part in spec.split(","):
            found = _INLINE.fullmatch(part)
            if found is None:
                raise DiscoveryError(
                    f"fake GPU spec {spec!r}: {part!r} is not COUNTxMiB; write e.g. 8x11178, "
                    f"2x81920,1x40960, or @/path/to/cards.yaml"
                )
            for _ in range(int(found[1])):
                index = len(cards)
                cards.append(
                    DiscoveredCard(
                        index=CardIndex(index),
                        uuid=self._uuid(index),
                        model="Fake GPU",
                        memory_mib=int(found[2]),
                    )
                )
        return cards

    def _parse_file(self, raw: object) -> tuple[list[DiscoveredCard], dict[str, int]]:
        entries = sequence(mapping(raw).get("cards"))
        if not entries:
            raise DiscoveryError(f"fake GPU spec {self._file}: no `cards:` list")
        cards: list[DiscoveredCard] = []
        xids: dict[str, int] = {}
        for index, entry in enumerate(entries):
            memory = entry.get("memoryMiB")
            if isinstance(memory, bool) or not isinstance(memory, int) or memory < 1:
                raise DiscoveryError(
                    f"fake GPU spec {self._file}: cards[{index}].memoryMiB must be a whole "
                    f"number >= 1, not {memory!r}"
                )
            numa = entry.get("numaNode")
            card = DiscoveredCard(
                index=CardIndex(index),
                uuid=text(entry.get("uuid")) or self._uuid(index),
                model=text(entry.get("model")) or "Fake GPU",
                memory_mib=memory,
                numa_node=numa if isinstance(numa, int) and not isinstance(numa, bool) else None,
            )
            cards.append(card)
            xid = entry.get("xid")
            if isinstance(xid, int) and not isinstance(xid, bool):
                xids[card.uuid] = xid
        return cards, xids

    def _parse_processes(self, raw: object) -> list[CardProcess]:
        found = []
        for entry in sequence(mapping(raw).get("processes")):
            pid, card, used = entry.get("pid"), entry.get("card"), entry.get("usedMiB")
            if isinstance(pid, int) and isinstance(card, int):
                mib = used if isinstance(used, int) and not isinstance(used, bool) else None
                found.append(CardProcess(pid=pid, card=CardIndex(card), used_mib=mib))
        return found

    def cards(self) -> list[DiscoveredCard]:
        return list(self._cards)

    def processes(self) -> Processes:
        if self._file is not None:
            self._reload()
        known = {card.index for card in self._cards}
        return Processes([p for p in self._processes if p.card in known], [])

    def wait_event(self, timeout_ms: int) -> XidEvent | None:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            if self._file is not None:
                self._reload()
            if self._pending:
                return self._pending.pop(0)
            if time.monotonic() >= deadline:
                return None
            time.sleep(_POLL_S)

    def probe(self, uuid: str) -> bool:
        if self._file is not None:
            self._reload()
        return uuid not in self._xids

    def close(self) -> None:
        pass
