"""Preemption on a real apiserver: a pod of higher priority that fits no card evicts the
cheapest set of pods of lower priority from one card, through the Eviction API, and is bound
there once they are gone; the victims and the preemptor are told in Events, the preemptor's
node is nominated as kube-scheduler nominates it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import pytest
import pytest_asyncio
from cluster import (
    bind_pod,
    bound,
    create_pod,
    events_of,
    eventually,
    gpu_index,
    gpu_pod,
    list_pods,
    read_pod,
    unschedulable,
)
from kubernetes_asyncio import client

from gpushare.kube import raw_json
from gpushare.model import contract
from gpushare.model.gangs import PLURAL, VOLCANO_GROUP_ANNOTATIONS, GroupApi
from gpushare_harness import ControlPlane, FakeGpuNode, create_gpu_node
from gpushare_harness.crds import install_podgroup_crds
from gpushare_harness.operator import OperatorProcess
from gpushare_harness.standin import act_as_device_plugins

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

Start = Callable[..., OperatorProcess]


@pytest_asyncio.fixture
async def cluster(api: client.ApiClient, core: client.CoreV1Api) -> AsyncIterator[client.CoreV1Api]:
    """A node of two 10000 MiB cards, the PriorityClasses `high` and `high-never` (the same
    value, preemptionPolicy Never), the PodGroup CRDs, and the device plugins' assignment (no
    kubelet runs here)."""
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=20000, gpu_number=2))
    classes = client.SchedulingV1Api(api)
    await classes.create_priority_class(
        client.V1PriorityClass(metadata=client.V1ObjectMeta(name="high"), value=1000)
    )
    await classes.create_priority_class(
        client.V1PriorityClass(
            metadata=client.V1ObjectMeta(name="high-never"), value=1000, preemption_policy="Never"
        )
    )
    await install_podgroup_crds(api)
    plugins = asyncio.create_task(act_as_device_plugins(api))
    yield core
    plugins.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await plugins


def pod(name: str, mib: int, *, high: bool = False, **labels: str) -> dict[str, Any]:
    body = gpu_pod(name, mib, terminationGracePeriodSeconds=0)
    if labels:
        body["metadata"]["labels"] = labels
    if high:
        body["spec"]["priorityClassName"] = "high"
    return body


def keep(app: str) -> dict[str, Any]:
    """A PodDisruptionBudget `keep-APP` that allows none of the pods of `app` to go."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": f"keep-{app}"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": app}}},
    }


async def fill(core: client.CoreV1Api, pods: list[tuple[str, int, str]]) -> None:
    """Bind each (name, MiB, card) in turn, checking it landed on its card."""
    for name, mib, card in pods:
        await create_pod(core, pod(name, mib, app=name))
        assert gpu_index(await bound(core, name)) == card, name


async def gone(core: client.CoreV1Api, name: str) -> None:
    async def absent() -> bool:
        return name not in {p["metadata"]["name"] for p in await list_pods(core)}

    await eventually(absent, what=f"pod {name} to be evicted")


async def messages(core: client.CoreV1Api, name: str, reason: str) -> list[str]:
    async def probe() -> list[str]:
        return [e["message"] for e in await events_of(core, name) if e["reason"] == reason]

    return await eventually(probe, what=f"a {reason} event on {name}")


async def test_a_pod_of_higher_priority_evicts_the_one_pod_that_makes_room_and_runs_there(
    cluster: client.CoreV1Api, start_operator: Start
) -> None:
    core = cluster
    start_operator()
    # Best-fit fills card 0 with a and b, then card 1 with c, d, e.
    await fill(
        core,
        [("a", 6000, "0"), ("b", 4000, "0"), ("c", 3000, "1"), ("d", 3500, "1"), ("e", 3500, "1")],
    )
    await create_pod(core, pod("h", 6000, high=True))

    pod_h = await bound(core, "h")
    assert gpu_index(pod_h) == "0"  # a alone makes room there; card 1 would take two pods
    await gone(core, "a")
    for name in ("b", "c", "d", "e"):
        assert not (await read_pod(core, name))["metadata"].get("deletionTimestamp"), name
    (preempted,) = await messages(core, "a", "Preempted")
    assert preempted == "Preempted by default/h (priority 1000) on node n card 0"
    (preempting,) = await messages(core, "h", "Preempting")
    assert preempting == "Evicting 1 pod(s) of lower priority from node n card 0 to make room: a"


async def test_a_budget_that_forbids_the_cheaper_victim_makes_the_next_one_go(
    api: client.ApiClient, cluster: client.CoreV1Api, start_operator: Start
) -> None:
    core = cluster
    start_operator()
    await fill(core, [("a", 6000, "0"), ("b", 4000, "0"), ("f", 6000, "1"), ("g", 4000, "1")])
    # a would go first (card 0 before card 1 at equal cost); its budget forbids it.
    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", cast(client.V1PodDisruptionBudget, keep("a"))
    )

    await create_pod(core, pod("h", 6000, high=True))
    assert gpu_index(await bound(core, "h")) == "1"
    await gone(core, "f")
    assert not (await read_pod(core, "a"))["metadata"].get("deletionTimestamp")


async def test_a_budget_that_protects_the_only_victim_is_broken_and_the_victim_deleted(
    api: client.ApiClient, cluster: client.CoreV1Api, start_operator: Start
) -> None:
    """As kube-scheduler: a tenant's PodDisruptionBudget cannot keep its pods of low priority
    from every pod of higher priority. The budget's pod is marked DisruptionTarget and deleted
    (the Eviction API would refuse it) with its own grace period, and its Event says which
    budget was broken."""
    core = cluster
    start_operator()
    victim = pod("a", 6000, app="a")
    victim["spec"]["terminationGracePeriodSeconds"] = 600  # no kubelet here: it stays Terminating
    await create_pod(core, victim)
    assert gpu_index(await bound(core, "a")) == "0"
    await fill(core, [("b", 4000, "0")])
    await create_pod(core, pod("f", 10000, high=True, app="f"))  # card 1: no one may evict it
    assert gpu_index(await bound(core, "f")) == "1"
    await client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default", cast(client.V1PodDisruptionBudget, keep("a"))
    )

    await create_pod(core, pod("h", 6000, high=True))

    async def terminating() -> dict[str, Any] | None:
        body = await read_pod(core, "a")
        return body if body["metadata"].get("deletionTimestamp") else None

    deleted = await eventually(terminating, what="a deleted")
    assert deleted["metadata"]["deletionGracePeriodSeconds"] == 600  # its own grace period
    (condition,) = (c for c in deleted["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert (condition["status"], condition["reason"]) == ("True", "PreemptionByScheduler")
    (preempted,) = await messages(core, "a", "Preempted")
    assert preempted == (
        "Preempted by default/h (priority 1000) on node n card 0; deleted past "
        "PodDisruptionBudget default/keep-a: no set of pods of lower priority that the budgets "
        "allow made room"
    )
    (preempting,) = await messages(core, "h", "Preempting")
    assert preempting.endswith("to make room: a; 1 of them deleted past their PodDisruptionBudgets")
    # What its kubelet would do once the container stopped; then h takes the card.
    await core.delete_namespaced_pod("a", "default", grace_period_seconds=0)
    assert gpu_index(await bound(core, "h")) == "0"
    for name in ("b", "f"):
        assert not (await read_pod(core, name))["metadata"].get("deletionTimestamp"), name


async def test_a_pod_that_never_preempts_or_has_no_one_below_it_waits(
    cluster: client.CoreV1Api, start_operator: Start
) -> None:
    core = cluster
    start_operator()
    await fill(core, [("a", 10000, "0"), ("b", 10000, "1")])
    never = pod("never", 6000)
    never["spec"]["priorityClassName"] = "high-never"  # admission sets preemptionPolicy Never
    await create_pod(core, never)
    assert "no preemption: its preemptionPolicy is Never" in await unschedulable(core, "never")
    await create_pod(core, pod("peer", 6000))
    assert "no preemption: no card would take it with pods of lower priority gone" in (
        await unschedulable(core, "peer")
    )
    for name in ("a", "b"):
        assert not (await read_pod(core, name))["metadata"].get("deletionTimestamp"), name


def cli(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpushare ARGS` as a person runs it."""
    command = [sys.executable, "-m", "gpushare_cli", "--kubeconfig", str(plane.kubeconfig)]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


async def test_simulate_shows_whom_a_pod_of_higher_priority_would_evict(
    cluster: client.CoreV1Api, start_operator: Start, plane: ControlPlane, tmp_path: Path
) -> None:
    core = cluster
    start_operator()
    # Card 0 would need both its pods gone; card 1, c alone.
    await fill(core, [("a", 5000, "0"), ("a2", 5000, "0"), ("b", 4000, "1"), ("c", 6000, "1")])
    manifest = tmp_path / "h.yaml"
    body = pod("h", 6000, high=True)
    body["spec"]["priority"] = 1000  # as the Priority admission plugin would set it
    manifest.write_text(json.dumps(body))
    shown = await asyncio.to_thread(cli, plane, "simulate", "-f", str(manifest))
    assert shown.returncode == 3, shown.stderr  # it would wait
    assert "would evict, on n card 1: default/c" in shown.stdout, shown.stdout
    as_json = await asyncio.to_thread(cli, plane, "simulate", "-f", str(manifest), "-o", "json")
    assert json.loads(as_json.stdout)["preempts"] == {
        "node": "n",
        "cards": [1],
        "victims": ["default/c"],
        "pastBudgets": [],
    }
    for name in ("a", "a2", "b", "c"):  # nothing was written
        assert not (await read_pod(core, name))["metadata"].get("deletionTimestamp"), name


async def gang(api: client.ApiClient, core: client.CoreV1Api, members: int, mib: int) -> None:
    """A Volcano PodGroup `job` of priority class `high` (minMember `members`) and its pods."""
    body = {
        "apiVersion": f"{GroupApi.VOLCANO.group}/{GroupApi.VOLCANO.version}",
        "kind": "PodGroup",
        "metadata": {"name": "job", "namespace": "default"},
        "spec": {"minMember": members, "priorityClassName": "high"},
    }
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        GroupApi.VOLCANO.group, GroupApi.VOLCANO.version, "default", PLURAL, body
    )
    for index in range(members):
        member = pod(f"m{index}", mib, high=True)
        member["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[0]: "job"}
        await create_pod(core, member)


async def test_a_gang_preempts_for_all_its_members_together(
    api: client.ApiClient, cluster: client.CoreV1Api, start_operator: Start
) -> None:
    core = cluster
    start_operator()
    await fill(core, [("a", 6000, "0"), ("b", 4000, "0"), ("f", 6000, "1"), ("g", 4000, "1")])
    await gang(api, core, 2, 6000)
    cards = {gpu_index(await bound(core, name)) for name in ("m0", "m1")}
    assert cards == {"0", "1"}
    for name in ("a", "f"):
        await gone(core, name)
    for name in ("b", "g"):
        assert not (await read_pod(core, name))["metadata"].get("deletionTimestamp"), name


async def test_a_gang_is_preempted_as_it_was_bound_not_as_its_minmember_was_raised_after(
    api: client.ApiClient, cluster: client.CoreV1Api, start_operator: Start
) -> None:
    """A tenant who raises its PodGroup's minMember once its pods are bound would make any
    one of them cost the whole gang, so that preemption took another tenant's pod instead:
    the operator holds the gang to the minMember its members were bound under."""
    core = cluster
    start_operator()
    await client.SchedulingV1Api(api).create_priority_class(
        client.V1PriorityClass(metadata=client.V1ObjectMeta(name="middle"), value=10)
    )
    other = pod("x", 5000)
    other["spec"]["priorityClassName"] = "middle"  # above the gang: its members go first
    other["metadata"]["annotations"] = {contract.GANG_MIN_MEMBER: "99"}  # forged: overwritten
    await create_pod(core, other)
    placed = await bound(core, "x")
    assert gpu_index(placed) == "0"
    assert placed["metadata"]["annotations"][contract.GANG_MIN_MEMBER] == "1"
    objects = client.CustomObjectsApi(api)
    group = GroupApi.VOLCANO
    body = {
        "apiVersion": f"{group.group}/{group.version}",
        "kind": "PodGroup",
        "metadata": {"name": "job", "namespace": "default"},
        "spec": {"minMember": 2},
    }
    await objects.create_namespaced_custom_object(
        group.group, group.version, "default", PLURAL, body
    )
    for index in range(3):
        member = pod(f"m{index}", 5000)
        member["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[0]: "job"}
        await create_pod(core, member)
    for index in range(3):
        annotations = (await bound(core, f"m{index}"))["metadata"]["annotations"]
        assert annotations[contract.GANG_MIN_MEMBER] == "2"
    await objects.patch_namespaced_custom_object(
        group.group,
        group.version,
        "default",
        PLURAL,
        "job",
        {"spec": {"minMember": 3}},
        _content_type="application/merge-patch+json",  # type: ignore[call-arg]
    )
    await asyncio.sleep(1)  # the operator's watch sees the raise

    await create_pod(core, pod("h", 5000, high=True))
    await bound(core, "h")
    (preempting,) = await messages(core, "h", "Preempting")
    assert preempting.startswith("Evicting 1 pod(s) of lower priority"), preempting
    assert not (await read_pod(core, "x"))["metadata"].get("deletionTimestamp")


async def test_a_gang_that_cannot_make_room_for_every_member_evicts_no_one(
    api: client.ApiClient, cluster: client.CoreV1Api, start_operator: Start
) -> None:
    core = cluster
    start_operator()
    await fill(core, [("a", 6000, "0"), ("b", 4000, "0")])
    # f, of the gang's priority, may not be evicted: room for one member only, so the gang
    # takes none.
    await create_pod(core, pod("f", 10000, high=True, app="f"))
    assert gpu_index(await bound(core, "f")) == "1"
    await gang(api, core, 2, 6000)

    async def refused() -> str | None:
        message = await unschedulable(core, "m0")
        return message if "no preemption:" in message and "together now" in message else None

    message = await eventually(refused, what="the gang's refusal to preempt")
    assert "no card would take it with pods of lower priority gone" in message
    for name in ("a", "b", "f"):
        assert not (await read_pod(core, name))["metadata"].get("deletionTimestamp"), name


async def fragment(core: client.CoreV1Api) -> None:
    """Card 0: a (5000, bare) and w1 (3000, a controller's); card 1: b (6000, bare) and w2
    (2000, a controller's); card 2: c (7000, bare); pending: p (5000), which fits once w1
    moves to card 2, and q (9000), which fits nowhere even then. Bound as the operator binds."""
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=30000, gpu_number=3))
    owner = await raw_json(
        core.create_namespaced_config_map(
            "default",
            client.V1ConfigMap(metadata=client.V1ObjectMeta(name="web")),
            _preload_content=False,
        )
    )
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "web",
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    for name, mib, card, owned in (
        ("a", 5000, "0", False),
        ("w1", 3000, "0", True),
        ("b", 6000, "1", False),
        ("w2", 2000, "1", True),
        ("c", 7000, "2", False),
    ):
        body = pod(name, mib)
        if owned:
            body["metadata"]["ownerReferences"] = [reference]
        await bind_pod(core, await create_pod(core, body), "n", {contract.GPU_INDEX: card})
    for name in ("p", "q"):
        await create_pod(core, pod(name, 5000 if name == "p" else 9000))


async def test_defrag_plans_the_fewest_moves_of_controlled_pods_for_a_waiting_pod(
    api: client.ApiClient, core: client.CoreV1Api, plane: ControlPlane, tmp_path: Path
) -> None:
    await fragment(core)  # no operator runs: `gpushare defrag` plans on its own
    shown = await asyncio.to_thread(cli, plane, "defrag", "-o", "json")
    assert shown.returncode == 3, shown.stderr  # q waits
    assert json.loads(shown.stdout) == {
        "rooms": [
            {
                "pod": "default/p",
                "node": "n",
                "card": 0,
                "freeBeforeMiB": 2000,
                "freedMiB": 5000,
                "moves": [
                    {
                        "pod": "default/w1",
                        "mib": 3000,
                        "from": {"node": "n", "card": 0},
                        "to": {"node": "n", "card": 2},
                    }
                ],
            }
        ],
        "waiting": [
            {
                "pod": "default/q",
                "reason": "no card would take it with the pods that may move moved elsewhere",
            }
        ],
    }
    text_plan = await asyncio.to_thread(cli, plane, "defrag", "--plan")
    assert "  move default/w1 (3000 MiB) from n card 0 to n card 2" in text_plan.stdout


async def test_the_operator_tells_the_plan_then_carries_it_out_when_told_to(
    api: client.ApiClient, core: client.CoreV1Api, start_operator: Start
) -> None:
    await fragment(core)
    start_operator(GPUSHARE_DEFRAGMENTATION="Plan", GPUSHARE_DEFRAG_INTERVAL="1")
    (planned,) = await messages(core, "p", "DefragmentationPlan")
    assert planned == (
        "moving 1 pod(s) would free 5000 MiB on node n card 0 (2000 MiB free now) for this "
        "pod: default/w1 (3000 MiB) to node n card 2"
    )
    assert not (await read_pod(core, "w1"))["metadata"].get("deletionTimestamp")
    await create_config(api, {"defragmentation": "Auto"})
    await gone(core, "w1")  # evicted; no controller runs here to replace it
    assert gpu_index(await bound(core, "p")) == "0"
    for name in ("a", "b", "c", "w2"):
        assert not (await read_pod(core, name))["metadata"].get("deletionTimestamp"), name
    (moved,) = await messages(core, "w1", "Defragmented")
    assert moved == (
        "Evicted to make room on node n card 0 for a waiting pod; its controller's "
        "replacement is placed again"
    )


async def create_config(api: client.ApiClient, spec: dict[str, Any]) -> None:
    config = {
        "apiVersion": "gpushare.io/v1alpha1",
        "kind": "GPUShareConfig",
        "metadata": {"name": "default"},
        "spec": spec,
    }
    await raw_json(
        client.CustomObjectsApi(api).create_cluster_custom_object(
            "gpushare.io", "v1alpha1", "gpushareconfigs", config, _preload_content=False
        )
    )
