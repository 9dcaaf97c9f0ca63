"""Cards and XID events from NVML through `pynvml` (nvidia-ml-py).

The module is injected (`NvmlDiscovery(nvml=...)`) so unit tests pass a stand-in and a GPU
machine passes the real one; nothing here holds a global handle.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from gpushare.model.annotations import CardIndex
from gpushare_plugin.discovery.base import (
    CardProcess,
    DiscoveredCard,
    DiscoveryError,
    Processes,
    XidEvent,
)

MIB = 1024 * 1024


def _text(value: str | bytes) -> str:
    """pynvml returns str on recent versions and bytes on old ones."""
    return value.decode() if isinstance(value, bytes) else value


_MORE_LISTS = (
    ("graphics processes", "nvmlDeviceGetGraphicsRunningProcesses"),
    ("MPS clients", "nvmlDeviceGetMPSComputeRunningProcesses"),
)
"""The process lists beside the compute list, by pynvml's names."""
_NOT_THERE = (3, 13)
"""NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND (a driver older than the call)."""


class NvmlDiscovery:
    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml: Any = nvml if nvml is not None else importlib.import_module("pynvml")
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as error:
            raise DiscoveryError(
                f"NVML could not start ({error}): run the plugin on a node with the NVIDIA "
                f"driver, with the NVIDIA container runtime (NVIDIA_VISIBLE_DEVICES=all), or "
                f"use --fake-gpus on a machine without GPUs"
            ) from error
        self._events: Any = None
        self.unmonitored: list[str] = []
        """UUIDs of cards that do not report XID events (their health is not watched)."""

    def cards(self) -> list[DiscoveredCard]:
        nvml = self._nvml
        found = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            found.append(
                DiscoveredCard(
                    index=CardIndex(i),
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    model=_text(nvml.nvmlDeviceGetName(handle)),
                    memory_mib=int(nvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
                    numa_node=self._numa_node(handle),
                )
            )
        return found

    def _numa_node(self, handle: object) -> int | None:
        try:
            node = int(self._nvml.nvmlDeviceGetNumaNodeId(handle))
        except (self._nvml.NVMLError, AttributeError):
            return None  # an old driver, or a card with no NUMA affinity
        return node if node >= 0 else None

    def _event_set(self) -> Any:
        if self._events is None:
            nvml = self._nvml
            self._events = nvml.nvmlEventSetCreate()
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                try:
                    nvml.nvmlDeviceRegisterEvents(
                        handle, nvml.nvmlEventTypeXidCriticalError, self._events
                    )
                except nvml.NVMLError:
                    # NVIDIA's plugin marks such a card unhealthy for ever; a card that
                    # cannot report errors is not broken, so it is served unwatched and
                    # the plugin logs it (see `unmonitored`).
                    self.unmonitored.append(_text(nvml.nvmlDeviceGetUUID(handle)))
        return self._events

    def wait_event(self, timeout_ms: int) -> XidEvent | None:
        nvml = self._nvml
        events = self._event_set()
        try:
            data = nvml.nvmlEventSetWait_v2(events, timeout_ms)
        except nvml.NVMLError as error:
            if getattr(error, "value", None) == nvml.NVML_ERROR_TIMEOUT:
                return None
            raise
        if data.eventType != nvml.nvmlEventTypeXidCriticalError:
            return None
        uuid = None
        if data.device:
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            except nvml.NVMLError:
                uuid = None
        return XidEvent(uuid=uuid, xid=int(data.eventData))

    def probe(self, uuid: str) -> bool:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid.encode())
            nvml.nvmlDeviceGetMemoryInfo(handle)
        except nvml.NVMLError:
            return False
        return True

    def processes(self) -> Processes:
        """Compute, graphics and MPS client processes of every card (a process in several
        lists is counted once, with the larger figure); a card that cannot say is a problem,
        the others still count; DiscoveryError when no card can. Under MPS, a client's
        memory is listed by the MPS call alone
        (the compute list shows the MPS server's); a driver or pynvml without that call, or a
        card without graphics, lists none there."""
        nvml = self._nvml
        found: list[CardProcess] = []
        problems: list[str] = []
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as error:
            raise DiscoveryError(f"NVML could not count the cards ({error})") from error
        more = [
            (what, call)
            for what, name in _MORE_LISTS
            if (call := getattr(nvml, name, None)) is not None
        ]
        silent = 0  # cards whose compute processes NVML could not list
        for i in range(count):
            seen: dict[int, int | None] = {}
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                listed = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
            except nvml.NVMLError as error:
                problems.append(f"card {i}: NVML could not list its processes ({error})")
                silent += 1
                continue
            for what, call in more:
                try:
                    listed += call(handle)
                except nvml.NVMLError as error:
                    if getattr(error, "value", None) not in _NOT_THERE:
                        problems.append(f"card {i}: NVML could not list its {what} ({error})")
            for process in listed:
                used = getattr(process, "usedGpuMemory", None)
                mib = int(used) // MIB if isinstance(used, int) else None
                pid = int(process.pid)
                # NVML may not know a process's memory in one list and know it in another.
                figures = [f for f in (seen.get(pid), mib) if f is not None]
                seen[pid] = max(figures) if figures else None
            found.extend(
                CardProcess(pid=pid, card=CardIndex(i), used_mib=mib) for pid, mib in seen.items()
            )
        if count and silent == count:
            # Not one card could say: nothing measured, rather than nothing used.
            raise DiscoveryError("; ".join(problems))
        return Processes(found, problems)

    def close(self) -> None:
        nvml = self._nvml
        if self._events is not None:
            nvml.nvmlEventSetFree(self._events)
            self._events = None
        nvml.nvmlShutdown()
