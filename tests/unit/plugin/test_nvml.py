"""The NVML backend over a stand-in `pynvml` module (the real one runs on a GPU machine)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from gpushare.model.annotations import CardIndex
from gpushare_plugin.discovery import DiscoveredCard, DiscoveryError, XidEvent
from gpushare_plugin.discovery.nvml import NvmlDiscovery

MIB = 1024 * 1024


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class StandInNvml:
    """The few pynvml calls the backend makes, over a table of cards."""

    cards: list[dict[str, Any]]
    events: list[Any] = field(default_factory=list)
    unsupported_events: set[int] = field(default_factory=set)
    broken: set[str] = field(default_factory=set)
    init_error: int | None = None
    calls: list[str] = field(default_factory=list)

    NVMLError = NVMLError
    NVML_ERROR_TIMEOUT = 10
    NVML_ERROR_NOT_SUPPORTED = 3
    nvmlEventTypeXidCriticalError = 8

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: bytes) -> int:
        for index, card in enumerate(self.cards):
            if card["uuid"].encode() == uuid:
                if card["uuid"] in self.broken:
                    raise NVMLError(15)  # GPU is lost
                return index
        raise NVMLError(6)

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return str(self.cards[handle]["uuid"]).encode()  # old pynvml returns bytes

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self.cards[handle]["name"])

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=self.cards[handle]["mib"] * MIB)

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        numa = self.cards[handle].get("numa")
        if numa is None:
            raise NVMLError(3)
        return int(numa)

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, kinds: int, events: str) -> None:
        if handle in self.unsupported_events:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)

    def nvmlEventSetWait_v2(self, events: str, timeout_ms: int) -> Any:
        if not self.events:
            raise NVMLError(self.NVML_ERROR_TIMEOUT)
        return self.events.pop(0)

    def nvmlEventSetFree(self, events: str) -> None:
        self.calls.append("free")

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        error = self.cards[handle].get("processes_error")
        if error is not None:
            raise NVMLError(error)
        return [
            SimpleNamespace(pid=p, usedGpuMemory=m)
            for p, m in self.cards[handle].get("compute", [])
        ]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        if self.cards[handle].get("mps") is None:
            raise NVMLError(13)  # a driver without the call
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.cards[handle]["mps"]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        if self.cards[handle].get("graphics") is None:
            raise NVMLError(self.NVML_ERROR_NOT_SUPPORTED)  # a compute-only card
        return [
            SimpleNamespace(pid=p, usedGpuMemory=m)
            for p, m in self.cards[handle].get("graphics", [])
        ]


def h200s(count: int = 2) -> StandInNvml:
    return StandInNvml(
        cards=[
            {"uuid": f"GPU-{i}", "name": "NVIDIA H200", "mib": 143771, "numa": i % 2}
            for i in range(count)
        ]
    )


def test_cards_are_read_with_index_uuid_model_size_and_numa() -> None:
    nvml = h200s()
    nvml.cards[1].pop("numa")
    assert NvmlDiscovery(nvml).cards() == [  # type: ignore[arg-type]
        DiscoveredCard(
            index=CardIndex(0), uuid="GPU-0", model="NVIDIA H200", memory_mib=143771, numa_node=0
        ),
        DiscoveredCard(index=CardIndex(1), uuid="GPU-1", model="NVIDIA H200", memory_mib=143771),
    ]


def test_a_missing_driver_is_a_clear_error() -> None:
    nvml = h200s()
    nvml.init_error = 9
    with pytest.raises(DiscoveryError, match="--fake-gpus"):
        NvmlDiscovery(nvml)  # type: ignore[arg-type]


def test_xid_events_name_their_card_and_a_timeout_is_no_event() -> None:
    nvml = h200s()
    xid = nvml.nvmlEventTypeXidCriticalError
    nvml.events = [
        SimpleNamespace(eventType=xid, device=1, eventData=79),
        SimpleNamespace(eventType=xid, device=None, eventData=48),
    ]
    discovery = NvmlDiscovery(nvml)  # type: ignore[arg-type]
    assert discovery.wait_event(100) == XidEvent(uuid="GPU-1", xid=79)
    assert discovery.wait_event(100) == XidEvent(uuid=None, xid=48)
    assert discovery.wait_event(100) is None


def test_a_card_without_event_support_is_served_but_reported_unmonitored() -> None:
    nvml = h200s()
    nvml.unsupported_events = {0}
    discovery = NvmlDiscovery(nvml)  # type: ignore[arg-type]
    assert discovery.wait_event(10) is None
    assert discovery.unmonitored == ["GPU-0"]


def test_probe_fails_while_the_driver_cannot_reach_the_card() -> None:
    nvml = h200s()
    discovery = NvmlDiscovery(nvml)  # type: ignore[arg-type]
    nvml.broken = {"GPU-1"}
    assert discovery.probe("GPU-0")
    assert not discovery.probe("GPU-1")
    nvml.broken = set()
    assert discovery.probe("GPU-1")


def test_close_frees_events_and_shuts_nvml_down() -> None:
    nvml = h200s()
    discovery = NvmlDiscovery(nvml)  # type: ignore[arg-type]
    discovery.wait_event(1)
    discovery.close()
    assert nvml.calls == ["init", "free", "shutdown"]


def test_each_cards_processes_are_listed_and_a_card_that_cannot_say_is_a_problem() -> None:
    nvml = h200s(3)
    nvml.cards[0]["compute"] = [
        (4711, 3590 * MIB),
        (4712, None),
        (4713, None),
    ]  # None: NVML cannot say
    nvml.cards[0]["graphics"] = [(4711, 100 * MIB), (4713, 200 * MIB)]  # counted once each
    nvml.cards[1]["processes_error"] = 15  # GPU is lost
    nvml.cards[2]["compute"] = [(99, 512 * MIB)]
    nvml.cards[2]["mps"] = [(123, 2048 * MIB)]  # an MPS client: listed by the MPS call alone
    found = NvmlDiscovery(nvml).processes()  # type: ignore[arg-type]
    assert sorted((p.pid, p.card, p.used_mib) for p in found.found) == [
        (99, 2, 512),
        (123, 2, 2048),
        (4711, 0, 3590),
        (4712, 0, None),
        (4713, 0, 200),  # the figure one list knows
    ]
    assert len(found.problems) == 1
    assert "card 1: NVML could not list its processes" in found.problems[0]


def test_when_no_card_can_say_nothing_is_measured_rather_than_nothing_used() -> None:
    nvml = h200s()
    discovery = NvmlDiscovery(nvml)  # type: ignore[arg-type]
    for card in nvml.cards:
        card["graphics"] = None  # idle cards (no graphics), whose MPS list cannot say

    def unknown(handle: int) -> list[SimpleNamespace]:
        raise NVMLError(999)

    nvml.nvmlDeviceGetMPSComputeRunningProcesses = unknown  # type: ignore[method-assign]
    idle = discovery.processes()  # their compute lists said: nothing used
    assert idle.found == []
    assert len(idle.problems) == 2
    for card in nvml.cards:
        card["processes_error"] = 999  # NVML_ERROR_UNKNOWN
    with pytest.raises(DiscoveryError, match="card 1: NVML could not list its processes"):
        discovery.processes()

    def lost() -> int:
        raise NVMLError(999)

    nvml.nvmlDeviceGetCount = lost  # type: ignore[method-assign]
    with pytest.raises(DiscoveryError, match="NVML could not count the cards"):
        discovery.processes()
