"""Gangs against a real apiserver with Volcano's and the scheduler-plugins' PodGroup CRDs (as
their releases ship them): all or nothing, progress for others, timeouts, bad input, a
restart mid-gang, and the PodGroup status Volcano's tools read."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from cluster import bind_pod, bound, create_pod, eventually, gpu_pod, read_pod, unschedulable
from kubernetes_asyncio import client

from gpushare.kube import raw_json
from gpushare.model import contract
from gpushare.model.gangs import COSCHEDULING_GROUP_LABEL, VOLCANO_GROUP_ANNOTATIONS, GroupApi
from gpushare_harness import ControlPlane, FakeGpuNode, create_gpu_node
from gpushare_harness.crds import install_podgroup_crds
from gpushare_harness.operator import OperatorProcess
from gpushare_harness.standin import act_as_device_plugins

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

Start = Callable[..., OperatorProcess]


@pytest_asyncio.fixture
async def groups(api: client.ApiClient) -> AsyncIterator[client.CustomObjectsApi]:
    """The PodGroup CRDs, and the device plugins' assignment (no kubelet runs here)."""
    await install_podgroup_crds(api)
    plugins = asyncio.create_task(act_as_device_plugins(api))
    yield client.CustomObjectsApi(api)
    plugins.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await plugins


async def create_group(
    objects: client.CustomObjectsApi,
    name: str,
    spec: dict[str, Any],
    api: GroupApi = GroupApi.VOLCANO,
) -> None:
    body = {
        "apiVersion": f"{api.group}/{api.version}",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }
    await objects.create_namespaced_custom_object(
        api.group, api.version, "default", "podgroups", body
    )


async def read_group(
    objects: client.CustomObjectsApi, name: str, api: GroupApi = GroupApi.VOLCANO
) -> dict[str, Any]:
    return await raw_json(
        objects.get_namespaced_custom_object(
            api.group, api.version, "default", "podgroups", name, _preload_content=False
        )
    )


def member(name: str, group: str, mib: int, api: GroupApi = GroupApi.VOLCANO) -> dict[str, Any]:
    pod = gpu_pod(name, mib)
    if api is GroupApi.VOLCANO:
        pod["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[0]: group}
    else:
        pod["metadata"]["labels"] = {COSCHEDULING_GROUP_LABEL: group}
    return pod


def explain(plane: ControlPlane, pod: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gpushare_cli", "--kubeconfig", str(plane.kubeconfig)]
    return subprocess.run(
        [*command, "explain", pod], capture_output=True, text=True, check=False, timeout=60
    )


async def node_of(core: client.CoreV1Api, name: str) -> str | None:
    node = (await read_pod(core, name))["spec"].get("nodeName")
    return node if isinstance(node, str) else None


async def test_two_gangs_that_each_fit_alone_one_runs_the_other_waits_then_runs(
    core: client.CoreV1Api,
    groups: client.CustomObjectsApi,
    start_operator: Start,
    plane: ControlPlane,
) -> None:
    # Two cards of 20000 MiB: four pods of 9000 MiB fit, eight do not.
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=40000, gpu_number=2))
    start_operator()
    await create_group(groups, "a", {"minMember": 4})
    await create_group(groups, "b", {"minMember": 4})
    for index in range(4):  # interleaved: one by one, neither gang can deadlock the other
        await create_pod(core, member(f"a{index}", "a", 9000))
        await create_pod(core, member(f"b{index}", "b", 9000))

    # Both gangs are complete once their fourth pods exist; either may go first.
    async def first_gang() -> str | None:
        for gang in ("a", "b"):
            if all([await node_of(core, f"{gang}{index}") for index in range(4)]):
                return gang
        return None

    first = await eventually(first_gang, what="one gang bound whole")
    second = "b" if first == "a" else "a"
    message = await unschedulable(core, f"{second}3")
    assert (
        f"gang PodGroup default/{second}: only 0 of minMember 4 pods can be placed together"
        in message
    )
    for index in range(4):
        assert await node_of(core, f"{second}{index}") is None

    async def waiting_condition() -> dict[str, Any] | None:
        status = (await read_group(groups, second)).get("status", {})
        conditions = {c["type"]: c for c in status.get("conditions", [])}
        found = conditions.get("Unschedulable", {})
        return found if "only 0 of minMember 4" in found.get("message", "") else None

    condition = await eventually(
        waiting_condition, what=f"PodGroup {second}'s Unschedulable condition"
    )
    assert condition["status"] == "True"
    assert condition["reason"] == "NotEnoughResources"
    assert (await read_group(groups, second))["status"]["phase"] == "Inqueue"
    # `gpushare explain` on a member explains its gang.
    explained = explain(plane, f"{second}0")
    assert explained.returncode == 0, explained.stderr
    assert (
        f"group: PodGroup default/{second} (scheduling.volcano.sh): minMember 4; its pods now: "
        "0 bound (0 running), 4 pending"
    ) in explained.stdout
    assert f"gang PodGroup default/{second}: only 0 of minMember 4 pods" in explained.stdout

    for index in range(4):  # the first job ends: the second runs, all of it
        await core.delete_namespaced_pod(f"{first}{index}", "default", grace_period_seconds=0)
    for index in range(4):
        await bound(core, f"{second}{index}")

    async def scheduled() -> bool:
        status = (await read_group(groups, second)).get("status", {})
        return [c["type"] for c in status.get("conditions", [])] == ["Scheduled"]

    await eventually(scheduled, what=f"PodGroup {second}'s Scheduled condition")


async def test_a_coscheduling_gang_of_minmember_3_binds_3_of_5_and_the_rest_wait_alone(
    core: client.CoreV1Api, groups: client.CustomObjectsApi, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=30000, gpu_number=1))
    start_operator()
    api = GroupApi.COSCHEDULING
    await create_group(groups, "job", {"minMember": 3}, api)
    for index in range(5):
        await create_pod(core, member(f"p{index}", "job", 10000, api))
    for index in range(3):
        await bound(core, f"p{index}")
    for index in (3, 4):
        message = await unschedulable(core, f"p{index}")
        assert "gang" not in message  # beyond the minimum: its own reason, as a single pod
        assert await node_of(core, f"p{index}") is None

    async def phase() -> str | None:
        found = (await read_group(groups, "job", api)).get("status", {}).get("phase")
        return found if found == "Scheduled" else None

    await eventually(phase, what="the coscheduling PodGroup's Scheduled phase")


async def test_a_gang_short_of_members_waits_times_out_and_runs_once_they_come(
    core: client.CoreV1Api, groups: client.CustomObjectsApi, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=40000, gpu_number=2))
    start_operator(GPUSHARE_GANG_TIMEOUT="2", GPUSHARE_UNSCHEDULABLE_RETRY="1")
    await create_group(groups, "g", {"minMember": 3})
    await create_pod(core, member("m0", "g", 1000))
    await create_pod(core, member("m1", "g", 1000))
    message = await unschedulable(core, "m1")
    assert "2 of minMember 3 pods exist (0 bound, 2 pending)" in message

    async def timed_out() -> str | None:
        found = await unschedulable(core, "m0")
        return found if "timed out" in found else None

    await eventually(timed_out, what="the gang's timeout")
    # A member deleted while the gang waits: the others wait on, and say so.
    await core.delete_namespaced_pod("m1", "default", grace_period_seconds=0)

    async def one_left() -> str | None:
        found = await unschedulable(core, "m0")
        return found if "1 of minMember 3 pods exist" in found else None

    await eventually(one_left, what="the reason without the deleted member")
    assert await node_of(core, "m0") is None
    await create_pod(core, member("m2", "g", 1000))
    await create_pod(core, member("m3", "g", 1000))
    for name in ("m0", "m2", "m3"):
        await bound(core, name)


async def test_bad_groups_get_a_clear_reason_and_a_missing_podgroup_changes_nothing(
    core: client.CoreV1Api, groups: client.CustomObjectsApi, start_operator: Start
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=40000, gpu_number=2))
    start_operator()
    await create_group(groups, "zero", {"minMember": 0})
    await create_group(groups, "negative", {"minMember": -1})
    await create_group(groups, "huge", {"minMember": 50})
    await create_pod(core, member("z", "zero", 1000))
    await create_pod(core, member("n", "negative", 1000))
    await create_pod(core, member("h", "huge", 1000))
    await create_pod(core, member("alone", "no-such-group", 1000))
    assert "minMember 0 is not a whole number of 1 or more" in await unschedulable(core, "z")
    assert "minMember -1 is not a whole number of 1 or more" in await unschedulable(core, "n")
    assert "1 of minMember 50 pods exist" in await unschedulable(core, "h")
    await bound(core, "alone")
    # The fix applied: the waiting member goes at once.
    volcano = GroupApi.VOLCANO
    await groups.patch_namespaced_custom_object(
        volcano.group,
        volcano.version,
        "default",
        "podgroups",
        "zero",
        {"spec": {"minMember": 1}},
        _content_type="application/merge-patch+json",  # type: ignore[call-arg]
    )
    await bound(core, "z")


async def test_a_podgroup_as_volcanos_docs_show_it_is_accepted_and_goes_inqueue(
    groups: client.CustomObjectsApi, start_operator: Start, core: client.CoreV1Api
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=40000, gpu_number=2))
    start_operator()
    await create_group(
        groups,
        "test",
        {
            "minMember": 1,
            "minResources": {"cpu": "3", "memory": "2048Mi"},
            "priorityClassName": "high-prority",
            "queue": "default",
        },
    )
    await create_group(
        groups, "too-big", {"minMember": 2, "minResources": {contract.GPU_MEMORY: "90000"}}
    )

    async def phases() -> tuple[str, str] | None:
        found = (
            (await read_group(groups, "test")).get("status", {}).get("phase"),
            (await read_group(groups, "too-big")).get("status", {}).get("phase"),
        )
        return found if None not in found else None

    # Volcano's job controller creates a job's pods once its PodGroup leaves Pending.
    assert await eventually(phases, what="both phases") == ("Inqueue", "Pending")


async def test_after_a_restart_mid_gang_the_rest_of_the_gang_is_bound(
    core: client.CoreV1Api, groups: client.CustomObjectsApi, start_operator: Start
) -> None:
    """What a leader killed between the binds of one gang leaves: two of four members bound
    (with their cards), two pending. The next leader completes the gang."""
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=40000, gpu_number=2))
    await create_group(groups, "g", {"minMember": 4})
    pods = [await create_pod(core, member(f"m{index}", "g", 9000)) for index in range(4)]
    for pod in pods[:2]:
        await bind_pod(
            core,
            pod,
            "n",
            {
                contract.GPU_INDEX: "0",
                contract.PREDICATE_TIME: "1",
                contract.GPU_ASSIGNED: "true",
            },
        )
    start_operator()
    for index in (2, 3):
        pod = await bound(core, f"m{index}")
        assert pod["metadata"]["annotations"][contract.GPU_INDEX] == "1"


async def test_beside_volcanos_scheduler_each_serves_its_own_gangs_and_podgroups(
    core: client.CoreV1Api, groups: client.CustomObjectsApi, start_operator: Start
) -> None:
    """gpushare serves `gpushare`, Volcano's scheduler `volcano`: gpushare binds and reports
    only the gangs whose pods name it, and leaves Volcano's PodGroups' status alone."""
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=40000, gpu_number=2))
    start_operator(GPUSHARE_SCHEDULER_NAMES="gpushare")
    await create_group(groups, "ours", {"minMember": 2})
    await create_group(groups, "theirs", {"minMember": 2})
    for index in range(2):
        pod = member(f"o{index}", "ours", 1000)
        pod["spec"]["schedulerName"] = "gpushare"
        await create_pod(core, pod)
        await create_pod(core, member(f"t{index}", "theirs", 1000))  # schedulerName volcano
    for index in range(2):
        await bound(core, f"o{index}")

    async def ours_reported() -> bool:
        return "status" in await read_group(groups, "ours")

    await eventually(ours_reported, what="the status of the PodGroup gpushare serves")
    # A gang of ours created after both: once its status is written, the writer has been
    # through every PodGroup since "theirs" existed.
    await create_group(groups, "later", {"minMember": 1})
    later = member("l0", "later", 1000)
    later["spec"]["schedulerName"] = "gpushare"
    await create_pod(core, later)

    async def later_reported() -> bool:
        return "status" in await read_group(groups, "later")

    await eventually(later_reported, what="the status of a PodGroup created after")
    assert "status" not in await read_group(groups, "theirs")
    for index in range(2):
        assert await node_of(core, f"t{index}") is None


async def test_a_gang_that_falls_below_its_minimum_before_it_runs_releases_its_cards(
    core: client.CoreV1Api, groups: client.CustomObjectsApi, start_operator: Start
) -> None:
    """A member deleted after the others were bound, before any ran: the controller's pods
    are evicted (their controller creates them again, to wait as a gang); bare pods are kept,
    and the PodGroup says so."""
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=40000, gpu_number=2))
    start_operator()
    owner = await raw_json(
        core.create_namespaced_config_map(
            "default",
            client.V1ConfigMap(metadata=client.V1ObjectMeta(name="job")),
            _preload_content=False,
        )
    )
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "job",
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    await create_group(groups, "owned", {"minMember": 3})
    await create_group(groups, "bare", {"minMember": 2})
    for index in range(3):
        pod = member(f"o{index}", "owned", 1000)
        pod["metadata"]["ownerReferences"] = [reference]
        await create_pod(core, pod)
    for index in range(2):
        await create_pod(core, member(f"b{index}", "bare", 1000))
    for name in ("o0", "o1", "o2", "b0", "b1"):
        await bound(core, name)

    await core.delete_namespaced_pod("o2", "default", grace_period_seconds=0)
    for name in ("o0", "o1"):

        async def evicted(name: str = name) -> bool:
            return bool((await read_pod(core, name))["metadata"].get("deletionTimestamp"))

        await eventually(evicted, what=f"{name}'s eviction")

    await core.delete_namespaced_pod("b1", "default", grace_period_seconds=0)

    async def kept_and_said() -> str | None:
        status = (await read_group(groups, "bare")).get("status", {})
        message = " ".join(c.get("message", "") for c in status.get("conditions", []))
        return message if "kept 1 bound pod(s) that no controller owns" in message else None

    await eventually(kept_and_said, what="the bare gang's reason")
    assert not (await read_pod(core, "b0"))["metadata"].get("deletionTimestamp")


async def test_of_two_waiting_gangs_the_one_of_the_higher_priority_class_goes_first(
    core: client.CoreV1Api,
    groups: client.CustomObjectsApi,
    start_operator: Start,
    api: client.ApiClient,
) -> None:
    await create_gpu_node(core, FakeGpuNode(name="n", gpu_memory=40000, gpu_number=2))
    await client.SchedulingV1Api(api).create_priority_class(
        client.V1PriorityClass(metadata=client.V1ObjectMeta(name="gang-high"), value=1000)
    )
    await create_group(groups, "first", {"minMember": 4})
    # A PodGroup naming the class while none of its pods were admitted with it lifts nobody (a
    # tenant who may create PodGroups would otherwise go before everyone, and preempt).
    await create_group(groups, "lifted", {"minMember": 4, "priorityClassName": "gang-high"})
    await create_group(groups, "urgent", {"minMember": 4, "priorityClassName": "gang-high"})
    for index in range(4):  # the older gangs first; all wait for the operator
        await create_pod(core, member(f"f{index}", "first", 9000))
    for index in range(4):
        await create_pod(core, member(f"l{index}", "lifted", 9000))
    for index in range(4):  # one admitted at the class, as a Volcano Job gives it its pods
        pod = member(f"u{index}", "urgent", 9000)
        if index == 0:
            pod["spec"]["priorityClassName"] = "gang-high"
        await create_pod(core, pod)
    start_operator()
    for index in range(4):
        await bound(core, f"u{index}")
    assert "gang PodGroup default/first" in await unschedulable(core, "f0")
    assert "gang PodGroup default/lifted" in await unschedulable(core, "l0")
