"""What `gpushare` prints: its version, help that names what exists, `-o yaml` (the JSON
document), `-o wide` (more columns, every card), and `explain` that says the largest free card
once per node when nothing fits."""

from __future__ import annotations

import importlib
import json
import re
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import gpu_pod
from scripted import Apiserver, forbidden, listing

from gpushare.model import contract
from gpushare.model.annotations import CardIndex
from gpushare.model.measured import ContainerUse, MeasuredUsage
from gpushare.model.usage import PodRef, PodUid
from gpushare_cli.kubeconfig import Source
from gpushare_cli.main import main, parser, program_name

GPUNODES = f"/apis/{contract.INVENTORY_GROUP}/{contract.INVENTORY_VERSION}/gpunodes"


@pytest.fixture(autouse=True)
def admin(apiserver: Apiserver) -> None:
    """A cluster admin: everything readable (no PodDisruptionBudget, no operator leading)."""
    apiserver["/apis/policy/v1/poddisruptionbudgets"] = listing()
    apiserver["/apis/coordination.k8s.io/v1/leases"] = listing()


def node(name: str) -> dict[str, Any]:
    ready = [{"type": "Ready", "status": "True"}]
    allocatable = {"pods": "110", "cpu": "8", "memory": "64Gi"}
    return {"metadata": {"name": name}, "status": {"conditions": ready, "allocatable": allocatable}}


def h200s(name: str, count: int = 8, *, unhealthy: tuple[int, ...] = ()) -> dict[str, Any]:
    """A GPUNode of 141 GiB cards at the default 512 MiB unit."""
    cards = [
        {
            "index": i,
            "uuid": f"GPU-{name}-{i}",
            "model": "NVIDIA H200",
            "memoryMiB": 144384,
            "health": contract.UNHEALTHY if i in unhealthy else contract.HEALTHY,
        }
        for i in range(count)
    ]
    return {"metadata": {"name": name}, "spec": {"memoryUnitMiB": 512, "cards": cards}}


def converted(pod: dict[str, Any], mib: int) -> dict[str, Any]:
    pod["metadata"]["annotations"].update(
        {contract.MEMORY_UNIT_MIB: "512", contract.GPU_MEMORY_MIB: f"cuda-container={mib}"}
    )
    return pod


def crowded(apiserver: Apiserver, *, unhealthy: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """Two nodes whose every card has some room, none 90112 MiB (176 x 512 MiB): gpu-1's
    eight cards each with a different amount free, gpu-2's two with the same; the pods."""
    pods = [
        converted(gpu_pod(f"p{i}", 120 + 3 * i, node="gpu-1", index=str(i), phase="Running"), 1)
        for i in range(8)
    ]
    pods += [
        converted(gpu_pod(f"q{i}", 200, node="gpu-2", index=str(i), phase="Running"), 1)
        for i in range(2)
    ]
    pods.append(converted(gpu_pod("big", 176), 90112))
    apiserver["/api/v1/nodes"] = listing(node("gpu-1"), node("gpu-2"))
    apiserver["/api/v1/pods"] = listing(*pods)
    apiserver[GPUNODES] = listing(h200s("gpu-1", unhealthy=unhealthy), h200s("gpu-2", 2))
    return pods


def gpushare(capsys: pytest.CaptureFixture[str], source: Source, *args: str) -> tuple[int, str]:
    status = main(["--kubeconfig", str(source.files[0]), "-n", "default", *args])
    shown = capsys.readouterr()
    assert shown.err == "", shown.err
    return status, shown.out


def test_version_prints_the_installed_distributions_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith(f"gpushare {version('kube-gpushare')} (")


def test_the_help_names_only_modules_and_functions_that_exist() -> None:
    helped = parser().format_help()
    named = re.findall(r"`(gpushare\w*(?:\.\w+)+)`", helped)
    assert named
    for dotted in named:
        module, _, attribute = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), attribute), dotted


def test_the_kubectl_plugin_calls_itself_kubectl_gpushare(monkeypatch: pytest.MonkeyPatch) -> None:
    assert program_name("/usr/local/bin/kubectl-gpushare") == "kubectl gpushare"
    assert program_name("/usr/local/bin/gpushare") == "gpushare"
    monkeypatch.setattr(sys, "argv", ["/home/u/.krew/bin/kubectl-gpushare"])
    assert parser().format_usage().startswith("usage: kubectl gpushare ")


def test_explain_says_the_largest_free_card_once_per_node_when_nothing_fits(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    crowded(apiserver)
    status, out = gpushare(capsys, source, "explain", "big")
    assert status == 0
    assert out.count("176 x 512 MiB") == 1
    assert "it asks for 90112 MiB (176 x 512 MiB) on one card" in out
    assert "cannot be placed now: 0/2 nodes are available: 2 no card with enough free GPU " in out
    rows = out.splitlines()[-3:]
    assert rows == [
        "NODE   WHY NOT                              CARDS",
        "gpu-1  no card with enough free GPU memory  most free: card 0, 82944 MiB",
        "gpu-2  no card with enough free GPU memory  most free: cards 0-1, 41984 MiB",
    ]


def test_cards_that_fail_otherwise_are_named_beside_the_largest_free_one(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    crowded(apiserver, unhealthy=(0, 5, 6))
    _, out = gpushare(capsys, source, "explain", "big")
    assert "gpu-1  no card with enough free GPU memory  most free: card 1, 81408 MiB; " in out
    assert "most free: card 1, 81408 MiB; cards 0, 5-6 unhealthy" in out


def test_explain_wide_has_a_row_per_card(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    crowded(apiserver, unhealthy=(5,))
    _, out = gpushare(capsys, source, "explain", "big", "-o", "wide")
    assert out.count("176 x 512 MiB") == 1
    table = out.splitlines()[-11:]
    assert table[0].split() == [
        "NODE",
        "WHY",
        "NOT",
        "CARD",
        "MODEL",
        "FREE",
        "MiB",
        "TOTAL",
        "MiB",
        "CARD",
        "PROBLEM",
    ]
    assert table[1].startswith("gpu-1  no card with enough free GPU memory  0     NVIDIA H200")
    assert table[1].endswith("82944     144384     too little free memory (< 90112)")
    assert table[6].endswith("75264     144384     unhealthy")
    assert len(table) == 11  # the head, 8 cards of gpu-1, 2 of gpu-2
    assert table[9].startswith("gpu-2")


def test_explain_wide_shows_a_bound_pods_card(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    crowded(apiserver)
    _, out = gpushare(capsys, source, "explain", "p3", "-o", "wide")
    assert out.splitlines()[-1] == (
        "card 3: NVIDIA H200 GPU-gpu-1-3, Healthy, 66048/144384 MiB allocated, 1 pod(s)"
    )


def test_explain_says_whom_preemption_would_delete_past_their_budget(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    low = converted(gpu_pod("low", 200, node="gpu-1", index="0", phase="Running"), 1)
    low["metadata"]["labels"] = {"app": "db"}
    urgent = converted(gpu_pod("urgent", 176), 90112)
    urgent["spec"]["priority"] = 100
    apiserver["/api/v1/nodes"] = listing(node("gpu-1"))
    apiserver["/api/v1/pods"] = listing(low, urgent)
    apiserver[GPUNODES] = listing(h200s("gpu-1", 1))
    budget = {
        "metadata": {"name": "keep-db", "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "db"}}, "maxUnavailable": 0},
        "status": {"disruptionsAllowed": 0},
    }
    apiserver["/apis/policy/v1/poddisruptionbudgets"] = listing(budget)
    _, out = gpushare(capsys, source, "explain", "urgent")
    assert "would evict" not in out  # its budget refuses an eviction: it is deleted
    assert (
        "would delete past PodDisruptionBudget default/keep-db, on gpu-1 card 0: default/low\n"
        in out
    )
    _, shown = gpushare(capsys, source, "explain", "urgent", "-o", "json")
    assert json.loads(shown)["preempts"]["pastBudgets"] == ["default/low"]


def test_inspect_wide_shows_each_cards_uuid_model_health_and_pod_count(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    crowded(apiserver, unhealthy=(5,))
    _, out = gpushare(capsys, source, "inspect", "-o", "wide")
    lines = out.splitlines()
    assert lines[0].split() == [
        "NODE",
        "CARD",
        "MODEL",
        "UUID",
        "HEALTH",
        "USED/TOTAL",
        "MiB",
        "MEASURED",
        "MiB",
        "PODS",
    ]
    assert lines[1].split() == [
        "gpu-1",
        "0",
        "NVIDIA",
        "H200",
        "GPU-gpu-1-0",
        "Healthy",
        "61440/144384",
        "-",
        "1",
    ]
    assert lines[6].split()[3:5] == ["GPU-gpu-1-5", "Unhealthy"]
    _, detailed = gpushare(capsys, source, "inspect", "gpu-2", "-d", "-o", "wide")
    assert detailed.splitlines()[1].endswith("1     default/q0 102400 MiB")


def test_inspect_wide_names_the_nodes_whose_cards_env_alone_names(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    crowded(apiserver)
    told_by_env, by_cdi = h200s("gpu-1"), h200s("gpu-2", 2)
    told_by_env["spec"]["deviceListStrategy"] = "envvar"
    by_cdi["spec"]["deviceListStrategy"] = "cdi-cri"
    apiserver[GPUNODES] = listing(told_by_env, by_cdi)
    _, wide = gpushare(capsys, source, "inspect", "-o", "wide")
    assert wide.splitlines()[-1].startswith(
        "cards named by NVIDIA_VISIBLE_DEVICES alone (envvar) on gpu-1: a container whose "
        "image or envFrom sets it can see every card there"
    )
    _, shown = gpushare(capsys, source, "inspect", "-o", "json")
    assert [n["deviceListStrategy"] for n in json.loads(shown)] == ["envvar", "cdi-cri"]
    apiserver[GPUNODES] = listing(h200s("gpu-1"), by_cdi)  # a plugin that does not say
    _, wide = gpushare(capsys, source, "inspect", "-o", "wide")
    assert "NVIDIA_VISIBLE_DEVICES" not in wide


@pytest.mark.parametrize(
    "args",
    [("inspect",), ("inspect", "-d"), ("explain", "big"), ("explain", "p0"), ("defrag",)],
)
def test_yaml_is_the_same_document_as_json(
    args: tuple[str, ...],
    apiserver: Apiserver,
    source: Source,
    capsys: pytest.CaptureFixture[str],
) -> None:
    crowded(apiserver)
    as_json = gpushare(capsys, source, *args, "-o", "json")
    as_yaml = gpushare(capsys, source, *args, "-o", "yaml")
    assert as_json[0] == as_yaml[0]
    assert yaml.safe_load(as_yaml[1]) == json.loads(as_json[1])


def test_simulate_prints_yaml_too(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crowded(apiserver)
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", **gpu_pod("w", 1)}))
    status, out = gpushare(capsys, source, "simulate", "-f", str(manifest), "-o", "yaml")
    assert status == 0
    shown = yaml.safe_load(out)
    assert (shown["pod"], shown["state"]) == ("default/w", "WouldBePlaced")


def owned(pod: dict[str, Any], replica_set: str) -> dict[str, Any]:
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": replica_set,
            "uid": f"uid-{replica_set}",
            "controller": True,
        }
    ]
    return pod


def test_defrag_wide_names_the_controller_that_replaces_each_moved_pod(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    apiserver["/api/v1/nodes"] = listing(node("n"))
    apiserver[GPUNODES] = listing(
        {
            "metadata": {"name": "n"},
            "spec": {
                "cards": [
                    {"index": i, "uuid": f"GPU-{i}", "memoryMiB": 10000, "health": "Healthy"}
                    for i in (0, 1)
                ]
            },
        }
    )
    apiserver["/api/v1/pods"] = listing(
        owned(gpu_pod("a", 3000, node="n", index="0", phase="Running"), "web-1"),
        owned(gpu_pod("b", 5000, node="n", index="1", phase="Running"), "db-1"),
        gpu_pod("w", 8000),
    )
    status, plain = gpushare(capsys, source, "defrag")
    assert status == 0
    assert "  move default/a (3000 MiB) from n card 0 to n card 1" in plain.splitlines()
    _, wide = gpushare(capsys, source, "defrag", "-o", "wide")
    assert (
        "  move default/a (3000 MiB) from n card 0 to n card 1, replaced by its "
        "ReplicaSet/web-1" in wide.splitlines()
    )


def test_inspect_marks_over_what_the_operator_judges_over_and_says_when_it_was_measured(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    # q0 asked 1 MiB (200 devices of 512 MiB reserved): its 600 MiB are over its grant, though
    # under what it reserves; q1 within its share.
    pods = {p["metadata"]["name"]: p for p in crowded(apiserver)}
    uses = tuple(
        ContainerUse(
            pod=PodRef(namespace="default", name=name, uid=PodUid(pods[name]["metadata"]["uid"])),
            container="cuda-container",
            card=CardIndex(index),
            used_mib=used,
            granted_mib=granted,
        )
        for name, index, used, granted in (("q0", 0, 600, 1), ("q1", 1, 1, 1))
    )
    measured = MeasuredUsage(at="2026-12-07T10:00:00Z", containers=uses, unmapped_mib={})
    gpunode = h200s("gpu-2", 2)
    gpunode["metadata"]["annotations"] = {contract.MEASURED_USAGE: measured.to_annotation()}
    apiserver[GPUNODES] = listing(h200s("gpu-1"), gpunode)
    _, out = gpushare(capsys, source, "inspect", "gpu-2", "-d")
    assert "default/q0 102400 MiB (uses 600 of 1 granted, over)" in out
    assert "default/q1 102400 MiB (uses 1 of 1 granted)" in out
    assert "at 2026-12-07T10:00:00Z" in out
    _, document = gpushare(capsys, source, "inspect", "gpu-2", "-o", "json")
    (shown,) = json.loads(document)
    assert shown["measuredAt"] == "2026-12-07T10:00:00Z"
    assert [pod["over"] for card in shown["cards"] for pod in card["pods"]] == [True, False]


def test_explain_names_a_node_whose_device_plugin_serves_not_the_pods_scheduler_name(
    apiserver: Apiserver,
    source: Source,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUSHARE_SCHEDULER_NAMES", "volcano,team-a")
    served = h200s("gpu-1", 2)
    served["spec"]["schedulerNames"] = ["volcano"]
    apiserver["/api/v1/nodes"] = listing(node("gpu-1"))
    asking = converted(gpu_pod("t", 12), 6144)
    asking["spec"]["schedulerName"] = "team-a"
    apiserver["/api/v1/pods"] = listing(asking)
    apiserver[GPUNODES] = listing(served)
    _, out = gpushare(capsys, source, "explain", "t")
    why = (
        "its device plugin serves pods of schedulerName volcano, not team-a (add team-a to the "
        "plugin's GPUSHARE_SCHEDULER_NAMES, or to Helm's schedulerNames, which sets the "
        "operator's and the plugins')"
    )
    assert f"0/1 nodes are available: 1 {why}. no preemption" in out
    assert out.splitlines()[-1].split(maxsplit=1) == ["gpu-1", f"{why}  -"]


def with_a_claim(apiserver: Apiserver) -> None:
    """One node, and pod t that mounts claim data."""
    apiserver["/api/v1/nodes"] = listing(node("gpu-1"))
    apiserver[GPUNODES] = listing(h200s("gpu-1", 2))
    asking = converted(gpu_pod("t", 12), 6144)
    asking["spec"]["volumes"] = [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]
    apiserver["/api/v1/pods"] = listing(asking)


def test_explain_says_a_pod_waits_for_its_claim_as_the_operator_would(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    with_a_claim(apiserver)
    claim = {"metadata": {"name": "data", "namespace": "default"}, "spec": {}}
    apiserver["/api/v1/persistentvolumeclaims"] = listing(claim)
    apiserver["/api/v1/persistentvolumes"] = listing()
    apiserver["/apis/storage.k8s.io/v1/storageclasses"] = listing()
    _, out = gpushare(capsys, source, "explain", "t")
    assert "0/1 nodes are available: 1 pod has unbound immediate PersistentVolumeClaims." in out


def test_explain_says_claims_are_not_checked_where_volumes_are_not_visible(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    with_a_claim(apiserver)
    apiserver["/api/v1/persistentvolumeclaims"] = listing()
    apiserver["/api/v1/persistentvolumes"] = forbidden("persistentvolumes")
    status = main(["--kubeconfig", str(source.files[0]), "-n", "default", "explain", "t"])
    shown = capsys.readouterr()
    assert status == 0
    assert "pods' claims are not checked (the operator checks them)" in shown.err
    assert "placeable now (bestfit): gpu-1 card 0" in shown.out
