"""`gpushare` for a user with rights in one namespace only (the built-in `edit` role bound
there): no cluster-wide pod list, no Nodes, no Lease in the operator's namespace. The CLI
reads what it may, takes the rest from the GPUNodes, and says on stderr, one line each, what
it could not see. And the operator's Lease is looked up where the operator runs, not in a
fixed namespace."""

from __future__ import annotations

import json
from typing import Any

import pytest
from builders import gpu_pod
from scripted import Apiserver, forbidden, listing

from gpushare.kube.clock import micro_time
from gpushare.model import contract
from gpushare_cli.kubeconfig import Source
from gpushare_cli.main import main
from gpushare_cli.partial import stand_in_pods, stands_for

GPUNODES = f"/apis/{contract.INVENTORY_GROUP}/{contract.INVENTORY_VERSION}/gpunodes"
LIVE = f"/apis/{contract.CONFIG_GROUP}/{contract.CONFIG_VERSION}/gpushareconfigs/default"
WEBHOOK = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpushare"
LEASES = "/apis/coordination.k8s.io/v1/leases"


def lease_at(namespace: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/gpushare-scheduler"


def converted(pod: dict[str, Any], mib: int) -> dict[str, Any]:
    """As the admission webhook stores it, at 512 MiB per device."""
    pod["metadata"]["annotations"].update(
        {contract.MEMORY_UNIT_MIB: "512", contract.GPU_MEMORY_MIB: f"cuda-container={mib}"}
    )
    return pod


def gpunode() -> dict[str, Any]:
    """Two 11264 MiB cards; the operator's status counts pods of three namespaces."""
    return {
        "metadata": {"name": "gpu-1"},
        "spec": {
            "memoryUnitMiB": 512,
            "cards": [
                {
                    "index": i,
                    "uuid": f"GPU-{i}",
                    "model": "NVIDIA A10",
                    "memoryMiB": 11264,
                    "health": "Healthy",
                }
                for i in (0, 1)
            ],
        },
        "status": {
            "cards": [
                {"index": 0, "healthy": True, "allocatedMiB": 6144, "pods": ["team-b/x"]},
                {
                    "index": 1,
                    "healthy": True,
                    "allocatedMiB": 4096,
                    "pods": ["team-a/mine", "team-c/y"],
                },
            ]
        },
    }


def team_a_pods() -> list[dict[str, Any]]:
    return [
        converted(gpu_pod("mine", 4, namespace="team-a", node="gpu-1", index="1"), 2048),
        converted(gpu_pod("small", 8, namespace="team-a"), 4096),
        converted(gpu_pod("train", 16, namespace="team-a"), 8192),
    ]


def edit_in_team_a(apiserver: Apiserver) -> None:
    """What RBAC answers a user with `edit` in team-a who may read GPUNodes."""
    apiserver["/api/v1/nodes"] = forbidden("nodes")
    apiserver["/api/v1/pods"] = forbidden("pods")
    apiserver["/api/v1/namespaces/team-a/pods"] = listing(*team_a_pods())
    apiserver[GPUNODES] = listing(gpunode())
    apiserver["/apis/policy/v1/poddisruptionbudgets"] = forbidden("poddisruptionbudgets")
    apiserver[LIVE] = forbidden("gpushareconfigs")
    apiserver[WEBHOOK] = forbidden("mutatingwebhookconfigurations")
    apiserver[LEASES] = forbidden("leases")
    apiserver[lease_at("gpushare-system")] = forbidden("leases")


def gpushare(
    capsys: pytest.CaptureFixture[str], source: Source, *args: str
) -> tuple[int, str, str]:
    status = main(["--kubeconfig", str(source.files[0]), *args])
    shown = capsys.readouterr()
    return status, shown.out, shown.err


def test_a_user_with_edit_in_one_namespace_explains_their_pod_with_the_cards_use_from_the_gpunodes(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_in_team_a(apiserver)
    status, out, err = gpushare(capsys, source, "explain", "small")  # the context's team-a
    assert status == 0, err
    # Best-fit counts team-b's 6144 MiB on card 0 (5120 MiB left there, 7168 on card 1):
    # card 0 is the tighter fit. Without the other namespaces it would have been card 1.
    assert "placeable now (bestfit): gpu-1 card 0 (1024 MiB (2 x 512 MiB) left)" in out
    assert err.splitlines() == [
        "note: the operator's Lease gpushare-system/gpushare-scheduler is not visible to you: "
        "decided with this shell's GPUSHARE_* environment (the live GPUShareConfig is not "
        "visible to you either)",
        "note: nodes are not visible to you: the cards are read from the GPUNodes, and the "
        "nodes' readiness, taints, labels and CPU/memory are not checked",
        "note: pods of namespaces other than team-a are not visible to you: the cards' use is "
        "taken from the GPUNodes' status (and only team-a's pods are weighed for preemption)",
    ]
    assert "no gpushare operator leads now" not in out  # it may lead: the Lease is not visible
    assert "/api/v1/namespaces/team-a/pods" in apiserver.asked


def test_what_other_namespaces_hold_counts_against_the_largest_free_card(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_in_team_a(apiserver)
    status, out, _ = gpushare(capsys, source, "explain", "train", "-n", "team-a")
    assert status == 0
    assert "cannot be placed now: 0/1 nodes are available: 1 no card with enough free" in out
    assert "it asks for 8192 MiB (16 x 512 MiB) on one card" in out
    assert "gpu-1  no card with enough free GPU memory  most free: card 1, 7168 MiB" in out


def test_inspect_shows_what_other_namespaces_hold_without_their_pods(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_in_team_a(apiserver)
    status, out, _ = gpushare(capsys, source, "inspect", "-d")
    assert status == 0
    assert "6144/11264" in out
    assert "other namespaces' pods 6144 MiB" in out
    assert "team-a/mine 2048 MiB, other namespaces' pods 2048 MiB" in out
    status, out, _ = gpushare(capsys, source, "inspect", "-o", "json")
    card0, card1 = json.loads(out)[0]["cards"]
    assert (card0["usedMiB"], card0["pods"], card0["otherNamespacesPods"]) == (
        6144,
        [],
        ["team-b/x"],
    )
    assert (card1["otherNamespacesMiB"], card1["otherNamespacesPods"]) == (2048, ["team-c/y"])


def test_without_gpunodes_a_bound_pod_is_explained_and_a_waiting_one_says_what_is_missing(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_in_team_a(apiserver)
    apiserver[GPUNODES] = forbidden("gpunodes")
    status, out, err = gpushare(capsys, source, "explain", "mine", "-n", "team-a")
    assert status == 0, err
    assert "bound to gpu-1, card 1; not yet started" in out
    assert (
        "note: GPUNodes are not visible to you: the cards cannot be known; ask for read "
        "access to gpunodes.gpushare.io (cluster-wide)" in err
    )
    status, out, err = gpushare(capsys, source, "explain", "train", "-n", "team-a")
    assert status == 1
    assert err.splitlines()[-1] == (
        "gpushare: pod team-a/train is not bound; where it could go cannot be worked out: "
        "neither nodes nor GPUNodes are visible to you, so the cards cannot be known; ask for "
        "read access to gpunodes.gpushare.io (cluster-wide)"
    )


def test_a_user_who_may_not_list_pods_in_the_namespace_is_told_to_name_theirs(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_in_team_a(apiserver)
    apiserver["/api/v1/namespaces/default/pods"] = forbidden("pods")
    status, _, err = gpushare(capsys, source, "explain", "small", "-n", "default")
    assert status == 1
    assert err.startswith("gpushare: you may not list pods in namespace default (")
    assert err.rstrip().endswith("name your namespace with -n")


def leading(holder: str, policy: str) -> tuple[int, Any]:
    return 200, {
        "metadata": {
            "name": "gpushare-scheduler",
            "annotations": {contract.EFFECTIVE_CONFIG: json.dumps({"policy": policy})},
        },
        "spec": {
            "holderIdentity": holder,
            "renewTime": micro_time(),
            "leaseDurationSeconds": 15,
        },
    }


def webhook_in(namespace: str) -> tuple[int, Any]:
    service = {"namespace": namespace, "name": "gpushare-webhook"}
    return 200, {"webhooks": [{"name": "gpu.gpushare.io", "clientConfig": {"service": service}}]}


def test_the_operators_lease_is_read_where_its_webhook_runs(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    """Installed with another operator namespace (a chart value): the CLI finds its Lease
    from the webhook's Service, though it may not list Leases everywhere."""
    edit_in_team_a(apiserver)
    apiserver[WEBHOOK] = webhook_in("gpu-ops")
    apiserver[lease_at("gpu-ops")] = leading("op-7", "firstfit")
    status, out, err = gpushare(capsys, source, "explain", "small", "-n", "team-a")
    assert status == 0, err
    assert "decided as the operator op-7 decides" in out
    assert "placeable now (firstfit): gpu-1 card 0" in out
    assert "Lease" not in err
    assert lease_at("gpushare-system") not in apiserver.asked


def test_a_lease_found_by_name_in_any_namespace_is_the_operators(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_in_team_a(apiserver)
    apiserver[WEBHOOK] = webhook_in("gpu-ops")
    stale = {"metadata": {"namespace": "old"}, "spec": {"renewTime": "2020-01-01T00:00:00Z"}}
    live = {"metadata": {"namespace": "gpu-sched"}, "spec": {"renewTime": micro_time()}}
    apiserver[LEASES] = listing(stale, live)
    apiserver[lease_at("gpu-sched")] = leading("op-9", "bestfit")
    status, out, _ = gpushare(capsys, source, "explain", "small", "-n", "team-a")
    assert status == 0
    assert "decided as the operator op-9 decides" in out


@pytest.mark.parametrize("how", ["option", "environment"])
def test_the_operator_namespace_can_be_named(
    how: str,
    apiserver: Apiserver,
    source: Source,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    edit_in_team_a(apiserver)
    apiserver[WEBHOOK] = webhook_in("gpu-ops")
    apiserver[lease_at("elsewhere")] = leading("op-3", "bestfit")
    named = ["--operator-namespace", "elsewhere"]
    if how == "environment":
        monkeypatch.setenv("GPUSHARE_LEASE_NAMESPACE", "elsewhere")
        named = []
    status, out, _ = gpushare(capsys, source, *named, "explain", "small", "-n", "team-a")
    assert status == 0
    assert "decided as the operator op-3 decides" in out
    assert LEASES not in apiserver.asked


def test_the_gpunodes_status_is_never_counted_below_what_the_visible_pods_hold() -> None:
    """A status written before the user's newest pod was bound counts less than the pods the
    user sees: nothing is made up for the others, and nothing taken away."""
    status = gpunode()
    status["status"]["cards"][1]["allocatedMiB"] = 1024  # older than team-a/mine's 2048
    made = stand_in_pods([status], team_a_pods(), "volcano")
    assert [
        (p["spec"]["nodeName"], p["metadata"]["annotations"][contract.GPU_INDEX]) for p in made
    ] == [("gpu-1", "0")]
    assert made[0]["spec"]["containers"][0]["resources"]["limits"] == {contract.GPU_MEMORY: "12"}
    assert stands_for(made[0]) == ("team-b/x",)
