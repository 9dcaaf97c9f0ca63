"""The vendored kubelet API and its committed stubs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpushare_plugin._proto.podresources_v1 import api_pb2 as podresources_pb2
from gpushare_plugin._proto.v1beta1 import api_pb2

ROOT = Path(__file__).resolve().parents[3]
GENERATED = ROOT / "device_plugin" / "gpushare_plugin" / "_proto"


def test_the_committed_stubs_match_what_the_proto_generates(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "protos" / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = tmp_path / "gpushare_plugin" / "_proto"
    for api in ("v1beta1", "podresources_v1"):
        for name in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py"):
            assert (fresh / api / name).read_text() == (GENERATED / api / name).read_text(), (
                f"{api}/{name} is stale: run `python protos/generate.py` and commit the result"
            )


def test_the_services_keep_the_kubelets_names() -> None:
    services = api_pb2.DESCRIPTOR.services_by_name
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    assert [m.full_name for m in services["Registration"].methods] == [
        "v1beta1.Registration.Register"
    ]
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions",
        "ListAndWatch",
        "GetPreferredAllocation",
        "Allocate",
        "PreStartContainer",
    ]


def test_the_pod_resources_service_keeps_the_kubelets_names() -> None:
    service = podresources_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert [m.full_name for m in service.methods] == [
        "v1.PodResourcesLister.List",
        "v1.PodResourcesLister.GetAllocatableResources",
        "v1.PodResourcesLister.Get",
    ]
