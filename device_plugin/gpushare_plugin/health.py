"""Card health from XID events, with a way back to Healthy.

Rules (NVIDIA's device plugin's, plus recovery, which it lacks: "FIXME: there is no way to
recover from the Unhealthy state"):
- XIDs that application faults cause (13, 31, 43, 45, 68, 109) say nothing about the card
  and are ignored, as are the XIDs listed in DP_DISABLE_HEALTHCHECKS; `all` (or `xids`)
  there turns health checking off.
- Any other XID marks its card Unhealthy; an XID without a card marks every card.
- An Unhealthy card is probed once no XID has arrived for `recovery_s`; when the driver
  answers normally it is Healthy again. A new XID restarts the wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpushare import logs
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.discovery import Discovery, XidEvent
from gpushare_plugin.inventory import InventoryPublisher
from gpushare_plugin.metrics import PluginMetrics

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True, kw_only=True, slots=True)
class HealthPolicy:
    enabled: bool = True
    ignored_xids: frozenset[int] = APPLICATION_XIDS
    recovery_s: float = 300.0

    @classmethod
    def from_setting(cls, disable: str, recovery_s: float) -> HealthPolicy:
        """DP_DISABLE_HEALTHCHECKS as NVIDIA's plugin reads it: `all`/`xids`, or a comma
        list of XIDs to ignore besides the application ones."""
        words = {w.strip().lower() for w in disable.split(",") if w.strip()}
        if words & {"all", "xids"}:
            return cls(enabled=False, recovery_s=recovery_s)
        extra = set()
        for word in words:
            if not word.isdigit():
                raise ValueError(
                    f"DP_DISABLE_HEALTHCHECKS={disable!r}: {word!r} is neither `all`, `xids` "
                    f"nor an XID number"
                )
            extra.add(int(word))
        return cls(ignored_xids=APPLICATION_XIDS | extra, recovery_s=recovery_s)


@dataclass(kw_only=True, slots=True)
class _Fault:
    xid: int
    last_seen: float


@dataclass(kw_only=True)
class CardHealth:
    """Which cards are Unhealthy, since when and why (by UUID)."""

    policy: HealthPolicy
    uuids: tuple[str, ...]
    _faults: dict[str, _Fault] = field(default_factory=dict)

    def unhealthy(self) -> frozenset[str]:
        return frozenset(self._faults)

    def xid_of(self, uuid: str) -> int | None:
        fault = self._faults.get(uuid)
        return fault.xid if fault else None

    def observe(self, event: XidEvent, now: float) -> list[str]:
        """Cards this event turns Unhealthy (empty when it is ignored or changes nothing)."""
        if not self.policy.enabled or event.xid in self.policy.ignored_xids:
            return []
        targets: Iterable[str] = self.uuids if event.uuid is None else (event.uuid,)
        turned = []
        for uuid in targets:
            if uuid not in self.uuids:
                continue
            if uuid not in self._faults:
                turned.append(uuid)
            self._faults[uuid] = _Fault(xid=event.xid, last_seen=now)
        return turned

    def due_for_probe(self, now: float) -> list[str]:
        """Unhealthy cards quiet for the recovery period: probe them."""
        return [
            uuid
            for uuid, fault in self._faults.items()
            if now - fault.last_seen >= self.policy.recovery_s
        ]

    def recover(self, uuid: str) -> bool:
        """Mark the card Healthy after a good probe; whether it was Unhealthy."""
        return self._faults.pop(uuid, None) is not None


async def watch_health(
    *,
    discovery: Discovery,
    health: CardHealth,
    table: DeviceTable,
    publisher: InventoryPublisher,
    metrics: PluginMetrics,
) -> None:
    """Turn XID events and recovery probes into the table's health, and publish changes.
    Runs for ever; NVML waits happen in a worker thread with a 1 s timeout."""
    log = logs.get("health", node=table.node)
    index_of = {card.uuid: card.index for card in table.cards}

    def show() -> None:
        for card in table.cards:
            metrics.cards.labels(str(card.index), card.uuid).set(int(table.healthy(card)))

    show()
    if not health.policy.enabled:
        log.warning("health checks disabled (DP_DISABLE_HEALTHCHECKS)")
    while True:
        event = None
        if health.policy.enabled:
            event = await asyncio.to_thread(discovery.wait_event, 1000)
        else:
            await asyncio.sleep(1)
        now = time.monotonic()
        if event is not None:
            turned = health.observe(event, now)
            for uuid in turned:
                log.warning("card unhealthy", card=index_of[uuid], uuid=uuid, xid=event.xid)
            if not turned:
                log.info("XID event changes nothing", uuid=event.uuid, xid=event.xid)
        for uuid in health.due_for_probe(now):
            if await asyncio.to_thread(discovery.probe, uuid):
                health.recover(uuid)
                log.info("card recovered", card=index_of[uuid], uuid=uuid)
        if await table.set_unhealthy(health.unhealthy()):
            publisher.dirty = True
            show()
        if publisher.dirty:
            await publisher.publish()
