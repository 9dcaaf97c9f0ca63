"""The operator's runtime against a scripted apiserver (no socket): it lists every kind, then
leads; a pending GPU pod is bound once the cache holds its node; a replica that leads from the
start lists each kind once, and one that takes over lists again what a leader writes (and
nothing else) before it binds; GPU pods made before gpushare labelled them get the label; a
task that fails with an error nothing handled stops the operator once, naming the task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
from builders import gpu_pod, ready_node
from leases import LEASE_LABEL, OneLease
from scripted import Answer

from gpushare.kube.clock import micro_time
from gpushare.model import Policy, contract
from gpushare.model.usage import PodRef
from gpushare_operator.config import OperatorConfig
from gpushare_operator.runtime import ConfigVerdict, Runtime

pytestmark = pytest.mark.asyncio

CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}), leader_elect=False)
ELECTED = OperatorConfig(  # a Lease that another replica's lapses in a second
    scheduler_names=frozenset({"volcano"}),
    identity="op-1",
    lease_duration_s=1,
    renew_deadline_s=0.5,
    retry_period_s=0.05,
)


class Apiserver(OneLease):
    """Lists what `objects` holds per resource (nothing else), and counts the LISTs; every
    watch stays quiet. The Lease and the fence's binding as `OneLease` keeps them. Binds are
    recorded; the other writes (events, statuses) are answered and forgotten."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]]) -> None:
        super().__init__()
        self.objects = objects
        self.lists: Counter[str] = Counter()
        self.bound: list[tuple[str, str]] = []
        self.bound_labels: dict[str, Mapping[str, str]] = {}
        self.was_bound = asyncio.Event()
        self.labelled: list[str] = []
        self.wrote = asyncio.Event()
        """Set at each bind and label."""

    def lister(self, resource: str) -> Any:
        async def call(**params: Any) -> Answer:
            if params.get("watch"):
                await asyncio.Event().wait()
            self.lists[resource] += 1
            items = self.objects.get(resource, [])
            return Answer(200, {"metadata": {"resourceVersion": "1"}, "items": items})

        return call

    async def bind(
        self, pod: PodRef, node: str, annotations: Mapping[str, str], labels: Mapping[str, str] = {}
    ) -> None:
        self.bound.append((pod.name, node))
        self.bound_labels[pod.name] = labels
        self.was_bound.set()
        self.wrote.set()

    async def label_gpu_pod(self, pod: PodRef) -> None:
        self.labelled.append(pod.name)
        self.wrote.set()

    def __getattr__(self, name: str) -> Any:
        async def answered(*args: Any, **kwargs: Any) -> str:
            return "answered"

        return answered


async def running(runtime: Runtime) -> None:
    runtime.start()
    await asyncio.wait_for(runtime.synced.wait(), 5)


async def test_a_pending_gpu_pod_is_bound_once_the_cache_holds_its_node() -> None:
    apiserver = Apiserver(
        {"nodes": [ready_node("n", 20000, 2)], "pods": [gpu_pod("train", 6000, uid="u1")]}
    )
    runtime = Runtime(config=CONFIG, api=apiserver, on_failure=lambda: None)
    try:
        await running(runtime)
        await asyncio.wait_for(apiserver.was_bound.wait(), 5)
    finally:
        await runtime.stop()
    assert apiserver.bound == [("train", "n")]
    assert runtime.failure is None


async def test_a_replica_that_leads_from_the_start_lists_each_kind_once() -> None:
    apiserver = Apiserver(
        {"nodes": [ready_node("n", 20000, 2)], "pods": [gpu_pod("train", 6000, uid="u1")]}
    )
    apiserver.fence_lag = 1  # the term set on the fence's binding holds from the second ask
    config = dataclasses.replace(ELECTED, lease_duration_s=15, renew_deadline_s=10)
    runtime = Runtime(config=config, api=apiserver, on_failure=lambda: None)
    try:
        await running(runtime)
        await asyncio.wait_for(apiserver.was_bound.wait(), 5)
    finally:
        await runtime.stop()
    assert apiserver.bound == [("train", "n")]
    assert (apiserver.lists["nodes"], apiserver.lists["pods"]) == (1, 1)


async def test_a_replica_that_takes_over_lists_pods_again_and_binds_none_the_leader_bound() -> None:
    apiserver = Apiserver(
        {"nodes": [ready_node("n", 20000, 2)], "pods": [gpu_pod("train", 8000, uid="u1")]}
    )
    apiserver.lease = {  # another replica's, live when this one starts
        "metadata": {"name": "gpushare-scheduler", "namespace": "gpushare-system", "uid": "uid-1"},
        "spec": {
            "holderIdentity": "op-0",
            "leaseDurationSeconds": 1,
            "renewTime": micro_time(time.time()),
            "leaseTransitions": 0,
        },
    }
    apiserver.fence = (LEASE_LABEL, "0.uid-1")
    runtime = Runtime(config=ELECTED, api=apiserver, on_failure=lambda: None)
    try:
        await running(runtime)
        assert not runtime.leading
        # Before its Lease runs out, the leader binds the pod; this replica's watch is quiet.
        apiserver.objects["pods"] = [
            gpu_pod("train", 8000, uid="u1", node="n", index="0"),
            gpu_pod("infer", 4000, uid="u2"),
        ]
        await asyncio.wait_for(apiserver.was_bound.wait(), 5)
    finally:
        await runtime.stop()
    assert apiserver.bound == [("infer", "n")]
    assert (apiserver.lists["nodes"], apiserver.lists["pods"]) == (1, 2)


async def test_a_task_failing_with_an_unhandled_error_stops_the_operator_once() -> None:
    stops: list[str] = []
    runtime = Runtime(
        config=CONFIG,
        api=Apiserver({}),
        on_failure=lambda: stops.append("stop"),
    )

    async def broken() -> None:
        raise RuntimeError("a bug")

    try:
        await running(runtime)
        runtime.spawn(broken(), "broken")
        runtime.spawn(broken(), "broken too")
        for _ in range(100):
            await asyncio.sleep(0)
    finally:
        await runtime.stop()
    assert stops == ["stop"]
    assert runtime.failure == "broken: RuntimeError('a bug')"


async def test_gpu_pods_made_before_the_label_get_it_from_the_leader_or_with_their_binding() -> (
    None
):
    def labelled(body: dict[str, Any]) -> dict[str, Any]:
        body["metadata"]["labels"] = dict(contract.GPU_POD_LABELS)
        return body

    others = gpu_pod("others", 1000)
    others["spec"]["schedulerName"] = "default-scheduler"
    apiserver = Apiserver(
        {
            "nodes": [ready_node("n", 20000, 2)],
            "pods": [
                gpu_pod("running", 4000, node="n", index="0", phase="Running"),
                others,
                gpu_pod("train", 6000),
                labelled(gpu_pod("infer", 2000)),
                labelled(gpu_pod("serving", 2000, node="n", index="1", phase="Running")),
                gpu_pod("done", 2000, node="n", index="1", phase="Succeeded"),
                gpu_pod("plain"),
            ],
        }
    )
    runtime = Runtime(config=CONFIG, api=apiserver, on_failure=lambda: None)
    try:
        await running(runtime)
        async with asyncio.timeout(5):
            while len(apiserver.bound) < 3 or len(apiserver.labelled) < 2:
                apiserver.wrote.clear()
                await apiserver.wrote.wait()
        await asyncio.sleep(0.1)  # and nothing more
    finally:
        await runtime.stop()
    assert sorted(apiserver.labelled) == ["others", "running"]
    assert apiserver.bound_labels == {"train": contract.GPU_POD_LABELS, "infer": {}, "plain": {}}


async def test_a_refused_spec_leaves_the_one_accepted_before_in_force_across_a_restart() -> None:
    accepted, refused = {"policy": "firstfit"}, {"backoffInitialSeconds": 20}  # above the max
    runtime = Runtime(config=CONFIG, api=Apiserver({}), on_failure=lambda: None)
    assert await runtime.apply_config("ADDED", "default", accepted) == ConfigVerdict(
        True, "applied", accepted
    )
    kept = await runtime.apply_config("MODIFIED", "default", refused)
    assert (kept.accepted, kept.in_force) == (False, accepted)
    assert kept.message.endswith("; the spec accepted before (status.inForce) stays in force")
    assert runtime.config.policy is Policy.FIRSTFIT
    restarted = Runtime(config=CONFIG, api=Apiserver({}), on_failure=lambda: None)
    again = await restarted.apply_config("ADDED", "default", refused, in_force=kept.in_force)
    assert (again.accepted, again.in_force, restarted.config.policy) == (
        False,
        accepted,
        Policy.FIRSTFIT,
    )
    fresh = Runtime(config=CONFIG, api=Apiserver({}), on_failure=lambda: None)
    unrecorded = await fresh.apply_config("ADDED", "default", refused)
    assert unrecorded.in_force is None
    assert unrecorded.message.endswith(
        "; the environment's values are in force (no spec accepted before is on record)"
    )
    assert fresh.config.policy is CONFIG.policy
