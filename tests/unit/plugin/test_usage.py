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
from gpushare.model.bound import bound_pod
from gpushare.model.device_list import DeviceListing
from gpushare.model.measured import MeasuredUsage
from gpushare_plugin.devices import DeviceTable
from gpushare_plugin.discovery.fake import FakeDiscovery
from gpushare_plugin.metrics import PluginMetrics
from gpushare_plugin.usage import UsageMeter

pytestmark = pytest.mark.asyncio

UID = "6f1a0c3e-5b2d-4c7a-9e8f-0a1b2c3d4e5f"
CONTAINER_ID = "b" * 64


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

    async def annotate_gpunode(self, node: str, annotations: dict[str, str]) -> None:
        self.written.append(annotations[contract.MEASURED_USAGE])


def running_pod() -> dict[str, Any]:
    pod = gpu_pod("train", 1024, node="n", index="0", uid=UID, phase="Running")
    pod["status"]["containerStatuses"] = [
        {"name": "cuda-container", "containerID": f"containerd://{CONTAINER_ID}"}
    ]
    return pod


def meter(tmp_path: Path, processes: list[dict[str, int]]) -> tuple[UsageMeter, Api, PluginMetrics]:
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
        pods=Pods(running_pod()),  # type: ignore[arg-type]
        granted={},
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
    labels = {"node": "n", "namespace": "default", "pod": "train", "container": "cuda-container"}
    used = metrics.registry.get_sample_value(
        "gpushare_plugin_container_gpu_memory_used_bytes", {**labels, "card": "0"}
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
