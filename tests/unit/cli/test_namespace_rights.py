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
from cli_runs import gpushare
from scripted import Apiserver, forbidden, listing

from gpushare.kube.clock import micro_time
from gpushare.model import contract
from gpushare_cli.kubeconfig import Source
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
    apiserver["/apis/policy/v1/namespaces/team-a/poddisruptionbudgets"] = listing()
    apiserver[LIVE] = forbidden("gpushareconfigs")
    apiserver[WEBHOOK] = forbidden("mutatingwebhookconfigurations")
    apiserver[LEASES] = forbidden("leases")
    apiserver[lease_at("gpushare-system")] = forbidden("leases")


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
        "note: PodDisruptionBudgets of namespaces other than team-a are not visible to you: "
        "preemption is shown as if none covered the pods there",
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


VOLCANO_PODGROUPS = "/apis/scheduling.volcano.sh/v1beta1"


def podgroup(name: str, min_member: int) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {"minMember": min_member},
    }


def gang_member(name: str, group: str) -> dict[str, Any]:
    member = converted(gpu_pod(name, 2, namespace="team-a"), 1024)
    member["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = group
    return member


def test_a_gang_member_is_explained_with_its_podgroup_read_from_the_users_namespace(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    """`edit` in team-a may list team-a's PodGroups, not every namespace's: the gang one of
    its four members is short of is still the operator's reason to wait."""
    edit_in_team_a(apiserver)
    apiserver["/api/v1/namespaces/team-a/pods"] = listing(gang_member("job-0", "job"))
    apiserver[VOLCANO_PODGROUPS] = (200, {"kind": "APIResourceList", "resources": []})
    apiserver[f"{VOLCANO_PODGROUPS}/podgroups"] = forbidden("podgroups")
    apiserver[f"{VOLCANO_PODGROUPS}/namespaces/team-a/podgroups"] = listing(podgroup("job", 4))
    status, out, err = gpushare(capsys, source, "explain", "job-0")
    assert status == 0, err
    assert "placeable now" not in out
    assert (
        "group: PodGroup team-a/job (scheduling.volcano.sh): minMember 4; its pods now: 0 "
        "bound (0 running), 1 pending\ncannot be placed now: gang PodGroup team-a/job: 1 of "
        "minMember 4 pods exist (0 bound, 1 pending)"
    ) in out
    assert (
        "note: PodGroups (scheduling.volcano.sh) of namespaces other than team-a are not "
        "visible to you: the pods of gangs there are taken as single pods"
    ) in err.splitlines()


def test_podgroups_of_an_api_the_cluster_does_not_serve_are_not_said_to_be_hidden(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    """RBAC refuses a tenant an API the cluster lacks as it refuses one it has: discovery
    tells them apart, and no note is said of PodGroups that cannot exist."""
    edit_in_team_a(apiserver)
    apiserver[f"{VOLCANO_PODGROUPS}/podgroups"] = forbidden("podgroups")
    apiserver[f"{VOLCANO_PODGROUPS}/namespaces/team-a/podgroups"] = forbidden("podgroups")
    _, _, err = gpushare(capsys, source, "explain", "small")
    assert "PodGroups" not in err
    apiserver[VOLCANO_PODGROUPS] = (200, {"kind": "APIResourceList", "resources": []})
    _, _, err = gpushare(capsys, source, "explain", "small")
    assert (
        "note: PodGroups (scheduling.volcano.sh) are not visible to you: the pods of its "
        "gangs are taken as single pods"
    ) in err.splitlines()


def urgent_beside_a_budgeted_pod(apiserver: Apiserver) -> None:
    """team-a's `mine` (on card 1, under the budget keep-mine) is the one pod whose eviction
    would make room for `urgent`."""
    mine, urgent = team_a_pods()[0], converted(gpu_pod("urgent", 16, namespace="team-a"), 8192)
    mine["metadata"]["labels"] = {"app": "mine"}
    urgent["spec"]["priority"] = 100
    apiserver["/api/v1/namespaces/team-a/pods"] = listing(mine, urgent)
    budget = {
        "metadata": {"name": "keep-mine", "namespace": "team-a"},
        "spec": {"selector": {"matchLabels": {"app": "mine"}}, "maxUnavailable": 0},
        "status": {"disruptionsAllowed": 0},
    }
    apiserver["/apis/policy/v1/namespaces/team-a/poddisruptionbudgets"] = listing(budget)


def test_preemption_heeds_the_budgets_of_the_users_namespace(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_in_team_a(apiserver)
    urgent_beside_a_budgeted_pod(apiserver)
    status, out, err = gpushare(capsys, source, "explain", "urgent")
    assert status == 0, err
    assert "would evict" not in out
    assert "would delete past PodDisruptionBudget team-a/keep-mine, on gpu-1 card 1: " in out
    assert (
        "note: PodDisruptionBudgets of namespaces other than team-a are not visible to you: "
        "preemption is shown as if none covered the pods there"
    ) in err.splitlines()


def test_budgets_the_user_may_not_list_at_all_are_said_to_be_unseen(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_in_team_a(apiserver)
    urgent_beside_a_budgeted_pod(apiserver)
    apiserver["/apis/policy/v1/namespaces/team-a/poddisruptionbudgets"] = forbidden("pdbs")
    status, out, err = gpushare(capsys, source, "explain", "urgent")
    assert status == 0, err
    assert "would evict, on gpu-1 card 1: team-a/mine" in out
    assert (
        "note: PodDisruptionBudgets are not visible to you: preemption is shown as if none "
        "covered a pod"
    ) in err.splitlines()


def test_a_lease_not_found_where_it_was_guessed_is_said_with_the_option_that_names_it(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    """A release installed in gpu-ops, and a tenant who may read its Lease but neither list
    Leases everywhere nor read the webhook's configuration: the default namespace has no
    Lease, which says nothing of whether an operator leads."""
    edit_in_team_a(apiserver)
    apiserver[lease_at("gpushare-system")] = (404, {"kind": "Status", "code": 404})
    apiserver[lease_at("gpu-ops")] = leading("op-1", "firstfit")
    status, out, err = gpushare(capsys, source, "explain", "small")
    assert status == 0, err
    assert "no gpushare operator leads now" not in out + err
    assert err.splitlines()[0] == (
        "note: the operator's Lease gpushare-system/gpushare-scheduler was not found in "
        "gpushare-system (the default: where the operator runs could be read neither from "
        "the Leases of every namespace nor from the admission webhook): decided with this "
        "shell's GPUSHARE_* environment (the live GPUShareConfig is not visible to you "
        "either); if the operator runs in another namespace, name it with "
        "--operator-namespace; if the operator names its Lease otherwise "
        "(GPUSHARE_LEASE_NAME), set that in this shell too; an operator that does not elect a "
        "leader publishes no Lease"
    )
    status, out, err = gpushare(
        capsys, source, "explain", "small", "--operator-namespace", "gpu-ops"
    )
    assert "decided as the operator op-1 decides" in out
    assert "Lease" not in err
    # Named by the user and not there: no other namespace to suggest.
    _, _, err = gpushare(
        capsys, source, "explain", "small", "--operator-namespace", "gpushare-system"
    )
    assert "--operator-namespace;" not in err
    assert err.splitlines()[0].endswith(
        "if the operator names its Lease otherwise (GPUSHARE_LEASE_NAME), set that in this "
        "shell too; an operator that does not elect a leader publishes no Lease"
    )


def test_a_lease_listed_in_no_namespace_means_no_operator_leads(
    apiserver: Apiserver, source: Source, capsys: pytest.CaptureFixture[str]
) -> None:
    edit_in_team_a(apiserver)
    apiserver[LEASES] = listing()
    _, out, err = gpushare(capsys, source, "explain", "small")
    assert "note: no gpushare operator leads now (its Lease is not held)" in out
    assert "Lease" not in err


@pytest.mark.parametrize(
    ("published", "problem"),
    [
        ('{"policy": "firstfit", "nextRelease": 1}', "invalid configuration: unknown field"),
        ("{not json", "Expecting property name enclosed in double quotes"),
        (None, "no gpushare.io/effective-config annotation"),
    ],
)
def test_a_held_lease_whose_configuration_cannot_be_read_is_not_said_to_be_free(
    apiserver: Apiserver,
    source: Source,
    capsys: pytest.CaptureFixture[str],
    published: str | None,
    problem: str,
) -> None:
    edit_in_team_a(apiserver)
    held = leading("op-2", "firstfit")
    annotations = held[1]["metadata"]["annotations"]
    if published is None:
        del annotations[contract.EFFECTIVE_CONFIG]
    else:
        annotations[contract.EFFECTIVE_CONFIG] = published
    apiserver[lease_at("gpushare-system")] = held
    status, out, err = gpushare(capsys, source, "explain", "small")
    assert status == 0, err
    assert "no gpushare operator leads now" not in out + err
    (said,) = [line for line in err.splitlines() if "Lease" in line]
    assert said.startswith(
        "note: the operator's Lease gpushare-system/gpushare-scheduler is held by op-2, whose "
        f"configuration this gpushare cannot read ({problem}"
    )
    assert said.endswith("; a gpushare CLI of the operator's version reads it")
