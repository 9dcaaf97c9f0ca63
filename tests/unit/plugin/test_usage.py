"""The device plugin's usage measurement: processes on the fake cards, their cgroups under a
proc root of the test's, the pods bound to the node, the grants; published as metrics and as
the GPUNode annotation."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import gpu_pod

from gpushare.model import contract
from gpushare.model.allocation import ContainerGrant
from gpushare.model.bound import bound_pod
from gpushare.model.device_list import DeviceListing
from gpushare.model.measured import MeasuredUsage
from gpushare.model.usage import PodRef, PodUid
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.discovery.fake import FakeDiscovery
from gpushare_plugin.metrics import PluginMetrics
from gpushare_plugin.usage import UsageMeter

pytestmark = pytest.mark.asyncio

UID = "6f1a0c3e-5b2d-4c7a-9e8f-0a1b2c3d4e5f"
CONTAINER_ID = "b" * 64
TRAIN = {"node": "n", "namespace": "default", "pod": "train", "container": "cuda-container"}
"""The labels of the running pod's container series (a card's beside)."""


class Pods:
    def __init__(self, *bodies: dict[str, Any]) -> None:
        self.bound = [bound_pod(body) for body in bodies]
        self.synced = asyncio.Event()
        self.synced.set()

    def pods(self) -> list[Any]:
        return self.bound


class Api:
    def __init__(self) -> None:
        self.written: list[str] = []
        self.wrote = asyncio.Event()

    async def annotate_gpunode(self, node: str, annotations: dict[str, str]) -> None:
        self.written.append(annotations[contract.MEASURED_USAGE])
        self.wrote.set()


def running_pod() -> dict[str, Any]:
    pod = gpu_pod("train", 1024, node="n", index="0", uid=UID, phase="Running")
    pod["status"]["containerStatuses"] = [
        {"name": "cuda-container", "containerID": f"containerd://{CONTAINER_ID}"}
    ]
    return pod


def meter(
    tmp_path: Path,
    processes: list[dict[str, int]],
    *pods: dict[str, Any],
    granted: dict[tuple[PodUid, str], ContainerGrant] | None = None,
) -> tuple[UsageMeter, Api, PluginMetrics]:
    spec = tmp_path / "cards.yaml"
    spec.write_text(yaml.safe_dump({"cards": [{"memoryMiB": 11178}], "processes": processes}))
    discovery = FakeDiscovery(f"@{spec}", node="n")
    table = DeviceTable(node="n", cards=discovery.cards(), unit_mib=1)
    proc = tmp_path / "proc"
    cgroup = f"0::/kubepods/burstable/pod{UID}/{CONTAINER_ID}\n"
    for pid, text in ((100, cgroup), (200, "0::/system.slice/sshd.service\n")):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    api, metrics = Api(), PluginMetrics()
    made = UsageMeter(
        discovery=discovery,
        table=table,
        pods=Pods(*(pods or (running_pod(),))),  # type: ignore[arg-type]
        granted={} if granted is None else granted,
        api=api,  # type: ignore[arg-type]
        metrics=metrics,
        proc_root=proc,
        listing=DeviceListing(),
        refresh_s=30,
    )
    return made, api, metrics


async def test_a_containers_processes_are_measured_beside_its_grant_and_published(
    tmp_path: Path,
) -> None:
    made, api, metrics = meter(
        tmp_path,
        [{"pid": 100, "card": 0, "usedMiB": 1500}, {"pid": 200, "card": 0, "usedMiB": 300}],
    )
    measured = await made.measure_and_publish()
    (use,) = measured.containers
    assert (str(use.pod), use.container, use.card) == ("default/train", "cuda-container", 0)
    assert (use.used_mib, use.granted_mib) == (1500, 1024)  # rebuilt from the pod: over
    assert measured.unmapped_mib == {0: 300}  # sshd's: no container, never acted on
    used = metrics.registry.get_sample_value(
        "gpushare_plugin_container_gpu_memory_used_bytes", {**TRAIN, "card": "0"}
    )
    assert used == 1500 * 1024 * 1024
    (written,) = api.written
    assert MeasuredUsage.from_annotation(written, owner="GPUNode n").containers == (use,)
    await made.measure_and_publish()
    assert len(api.written) == 1  # nothing changed: not written again within the refresh


async def test_a_pid_that_ended_since_the_driver_listed_it_counts_for_no_container(
    tmp_path: Path,
) -> None:
    made, _, _ = meter(tmp_path, [{"pid": 999, "card": 0, "usedMiB": 800}])
    measured = await made.measure_and_publish()
    assert measured.containers == ()
    assert measured.unmapped_mib == {0: 800}


async def test_a_container_whose_grant_cannot_be_told_is_shown_and_never_judged(
    tmp_path: Path,
) -> None:
    # Served before the plugin restarted, on a card the node no longer has.
    pod = running_pod()
    pod["metadata"]["annotations"][contract.GPU_INDEX] = "5"
    made, api, metrics = meter(tmp_path, [{"pid": 100, "card": 0, "usedMiB": 1500}], pod)
    (use,) = (await made.measure_and_publish()).containers
    assert (use.used_mib, use.granted_mib, use.over) == (1500, None, False)
    (written,) = api.written
    assert MeasuredUsage.from_annotation(written, owner="GPUNode n").containers == (use,)
    granted = "gpushare_plugin_container_gpu_memory_granted_bytes"
    assert metrics.registry.get_sample_value(granted, {**TRAIN, "card": "0"}) is None


async def test_a_debug_containers_process_is_its_pods_and_was_granted_nothing(
    tmp_path: Path,
) -> None:
    pod = running_pod()
    pod["status"]["containerStatuses"] = []
    pod["status"]["ephemeralContainerStatuses"] = [
        {"name": "debugger", "containerID": f"containerd://{CONTAINER_ID}"}
    ]
    made, _, _ = meter(tmp_path, [{"pid": 100, "card": 0, "usedMiB": 700}], pod)
    (use,) = (await made.measure_and_publish()).containers
    assert (use.container, use.used_mib, use.granted_mib, use.over) == ("debugger", 700, 0, True)


async def test_the_series_of_a_container_gone_are_removed_and_its_cards_kept(
    tmp_path: Path,
) -> None:
    made, _, metrics = meter(
        tmp_path,
        [{"pid": 100, "card": 0, "usedMiB": 1500}, {"pid": 200, "card": 0, "usedMiB": 300}],
    )
    await made.measure_and_publish()
    used = "gpushare_plugin_container_gpu_memory_used_bytes"
    unmapped = "gpushare_plugin_unmapped_gpu_memory_used_bytes"
    made._pods.bound = []  # type: ignore[attr-defined]  # the pod was deleted
    await made.measure_and_publish()
    assert metrics.registry.get_sample_value(used, {**TRAIN, "card": "0"}) is None
    assert metrics.registry.get_sample_value(unmapped, {"node": "n", "card": "0"}) == (
        1800 * 1024 * 1024
    )


async def test_a_measurement_that_fails_is_logged_and_the_next_one_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    made, api, _ = meter(tmp_path, [{"pid": 100, "card": 0, "usedMiB": 1500}])
    real = FakeDiscovery.processes
    calls = 0

    def fails_once(discovery: FakeDiscovery) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("NVML: Unknown Error")
        return real(discovery)

    monkeypatch.setattr(FakeDiscovery, "processes", fails_once)
    task = asyncio.create_task(made.run(0.01))
    try:
        async with asyncio.timeout(5):
            await api.wrote.wait()
    finally:
        task.cancel()
    assert "usage_not_measured" in capsys.readouterr().out
    assert calls >= 2


async def test_the_record_of_what_was_given_forgets_pods_gone_from_the_node(
    tmp_path: Path,
) -> None:
    gone = PodRef(namespace="default", name="done", uid=PodUid("gone"))
    given = ContainerGrant(pod=gone, container="c", position=0, last=True, cards=(), env={})
    granted = {(gone.uid, "c"): given}
    made, _, _ = meter(tmp_path, [{"pid": 100, "card": 0, "usedMiB": 100}], granted=granted)
    await made.measure_and_publish()
    assert granted == {}
