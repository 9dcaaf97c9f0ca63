"""Processes on the cards mapped to containers, and over-use judged from that."""

from __future__ import annotations

import pytest

from gpushare.model.annotations import CardIndex
from gpushare.model.errors import InvalidAnnotation
from gpushare.model.measured import (
    CgroupPlace,
    Grant,
    MeasuredUsage,
    Process,
    container_of,
    measure,
)
from gpushare.model.overuse import OverUsePolicy, OverUseWatch
from gpushare.model.usage import PodRef, PodUid

UID = "6f1a0c3e-5b2d-4c7a-9e8f-0a1b2c3d4e5f"
UNDERSCORED = UID.replace("-", "_")
CONTAINER = "a3f5" * 16


@pytest.mark.parametrize(
    "cgroup",
    [
        # cgroup v2, the systemd driver, containerd; CRI-O; guaranteed QoS (no QoS level).
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice"
        f"/cri-containerd-{CONTAINER}.scope",
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}"
        f".slice/crio-{CONTAINER}.scope",
        f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/cri-containerd-{CONTAINER}.scope",
        # the cgroupfs driver, under a kubelet's own root.
        f"0::/kubepods/besteffort/pod{UID}/{CONTAINER}",
        f"0::/gpushare-node-1/kubepods/pod{UID}/{CONTAINER}",
        # cgroup v1: one line per hierarchy.
        f"12:pids:/kubepods/burstable/pod{UID}/{CONTAINER}\n"
        f"11:memory:/kubepods/burstable/pod{UID}/{CONTAINER}",
        # crun (CRI-O) puts the container's processes in a cgroup below its scope; a
        # container may make cgroups of its own (systemd inside it: init.scope).
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice"
        f"/crio-{CONTAINER}.scope/container",
        f"0::/kubepods/burstable/pod{UID}/{CONTAINER}/init.scope",
    ],
)
def test_a_containers_process_is_placed_by_its_cgroup_in_every_layout(cgroup: str) -> None:
    assert container_of(cgroup) == CgroupPlace(PodUid(UID), (CONTAINER,))


NEIGHBOURS = "b" * 64
NODE = "c" * 64


@pytest.mark.parametrize(
    "cgroup",
    [
        # A cgroup the container made, named like its neighbour's: it names no other.
        f"0::/kubepods/burstable/pod{UID}/{CONTAINER}/{NEIGHBOURS}",
        # A node that is itself a container (kind): its id, which no pod knows, comes first.
        f"0::/docker/{NODE}/kubepods/burstable/pod{UID}/{CONTAINER}",
    ],
)
def test_the_outermost_container_the_node_knows_is_the_process_s(cgroup: str) -> None:
    place = container_of(cgroup)
    assert place is not None
    known = {CONTAINER: "mine", NEIGHBOURS: "the neighbour's"}
    assert place.container_in(known) == "mine"


def test_without_per_qos_cgroups_the_container_id_alone_places_a_process() -> None:
    # cgroupsPerQOS: false (the test nodes): containerd's own parent, no pod in the path.
    cgroup = f"4:memory:/k8s.io/{CONTAINER}\n0::/\n"
    assert container_of(cgroup) == CgroupPlace(None, (CONTAINER,))


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/system.slice/containerd.service",
        "4:memory:/process_api/a64d0c6f11ea8f4ca86c5c2338cee7cd",
        "0::/user.slice/user-0.slice/session-1.scope",
        f"0::/kubepods/besteffort/pod{UID}",  # the pod's own cgroup: no container
        f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice",
        "",
    ],
)
def test_a_process_in_no_pods_container_is_not_placed(cgroup: str) -> None:
    assert container_of(cgroup) is None


POD = PodRef(namespace="team", name="train", uid=PodUid(UID))
NEIGHBOUR = PodRef(namespace="team", name="infer", uid=PodUid("n"))


def measured() -> MeasuredUsage:
    processes = [
        Process(1, CardIndex(0), 700),
        Process(2, CardIndex(0), 600),  # the same container: summed
        Process(3, CardIndex(0), 500),  # the neighbour, within its share
        Process(4, CardIndex(1), 300),  # the first container, on a card it was not given
        Process(5, CardIndex(0), 200),  # no known container
        Process(6, CardIndex(0), 50),
    ]
    places = {
        1: CgroupPlace(POD.uid, ("c1",)),
        2: CgroupPlace(None, ("c1",)),  # a layout whose path names no pod
        3: CgroupPlace(NEIGHBOUR.uid, ("c2",)),
        4: CgroupPlace(POD.uid, ("c1",)),
        5: None,
        6: CgroupPlace(NEIGHBOUR.uid, ("c1",)),  # names another pod than the id's: not believed
    }
    containers = {"c1": (POD, "main"), "c2": (NEIGHBOUR, "main")}
    grants = {
        (POD.uid, "main"): Grant({CardIndex(0): 1024}),
        (NEIGHBOUR.uid, "main"): Grant({CardIndex(0): 1024}),
    }
    return measure(processes, places, containers, grants, at="2026-12-04T20:00:00Z")


def test_use_is_summed_per_container_and_card_beside_its_grant() -> None:
    found = {(u.pod.name, u.card): (u.used_mib, u.granted_mib) for u in measured().containers}
    assert found == {
        ("train", 0): (1300, 1024),
        ("train", 1): (300, 0),
        ("infer", 0): (500, 1024),
    }
    assert measured().unmapped_mib == {CardIndex(0): 250}


def test_the_annotation_reads_back_as_written_and_refuses_what_it_is_not() -> None:
    written = measured()
    assert MeasuredUsage.from_annotation(written.to_annotation(), owner="GPUNode n") == written
    with pytest.raises(InvalidAnnotation, match="GPUNode n"):
        MeasuredUsage.from_annotation('{"cards": 3}', owner="GPUNode n")


def judge(watch: OverUseWatch, now: float, policy: OverUsePolicy, at: float = 0.0) -> list[str]:
    actions = watch.observe(
        "n", measured(), measured_at=at, now=now, policy=policy, grace_s=30, max_age_s=90
    )
    return sorted(
        f"{a.use.pod.name}/{a.use.card}/{'evict' if a.evict else 'warn'}" for a in actions
    )


def test_only_the_over_user_is_acted_on_after_the_grace_and_once_per_episode() -> None:
    watch = OverUseWatch()
    assert judge(watch, 0, OverUsePolicy.EVICT) == []  # over, but not for the grace yet
    assert judge(watch, 31, OverUsePolicy.EVICT) == ["train/0/evict", "train/1/evict"]
    assert judge(watch, 62, OverUsePolicy.EVICT) == []  # acted on: once per episode


def test_an_episode_warned_of_is_evicted_once_the_policy_becomes_evict() -> None:
    watch = OverUseWatch()
    judge(watch, 0, OverUsePolicy.WARN)
    assert judge(watch, 31, OverUsePolicy.WARN) == ["train/0/warn", "train/1/warn"]
    assert judge(watch, 40, OverUsePolicy.WARN) == []
    assert judge(watch, 41, OverUsePolicy.EVICT) == ["train/0/evict", "train/1/evict"]
    assert judge(watch, 42, OverUsePolicy.WARN) == []  # evicted already: nothing to warn of


def test_warn_and_ignore() -> None:
    watch = OverUseWatch()
    judge(watch, 0, OverUsePolicy.WARN)
    assert judge(watch, 31, OverUsePolicy.WARN) == ["train/0/warn", "train/1/warn"]
    ignoring = OverUseWatch()
    judge(ignoring, 0, OverUsePolicy.IGNORE)
    assert judge(ignoring, 31, OverUsePolicy.IGNORE) == []


def test_a_stale_measurement_ends_every_episode_and_a_refused_eviction_is_tried_again() -> None:
    watch = OverUseWatch()
    judge(watch, 0, OverUsePolicy.EVICT)
    (action, _) = watch.observe(
        "n", measured(), measured_at=30, now=31, policy=OverUsePolicy.EVICT, grace_s=30,
        max_age_s=90,
    )  # fmt: skip
    watch.retry_later(action, now=31, after_s=30)
    assert judge(watch, 50, OverUsePolicy.EVICT, at=50) == []
    assert "train/0/evict" in judge(watch, 62, OverUsePolicy.EVICT, at=62)
    # The plugin stopped measuring: what it said last is not acted on.
    assert judge(watch, 500, OverUsePolicy.EVICT, at=100) == []
    assert judge(watch, 501, OverUsePolicy.EVICT, at=501) == []  # a new episode begins


def test_an_episode_outlasts_a_measurement_within_the_share_but_not_a_grace_period() -> None:
    watch = OverUseWatch()
    judge(watch, 0, OverUsePolicy.EVICT)
    # One measurement within its share (or a card NVML could not list once): still the episode.
    within = MeasuredUsage(at="2026-12-04T20:00:10Z", containers=(), unmapped_mib={})
    assert (
        watch.observe(
            "n",
            within,
            measured_at=10,
            now=10,
            policy=OverUsePolicy.EVICT,
            grace_s=30,
            max_age_s=90,
        )
        == []
    )
    assert judge(watch, 31, OverUsePolicy.EVICT, at=31) == ["train/0/evict", "train/1/evict"]
    # Within its share for a whole grace period: the episode ended, the next one starts afresh.
    for now in (40, 61):
        watch.observe(
            "n", within, measured_at=now, now=now, policy=OverUsePolicy.EVICT, grace_s=30,
            max_age_s=90,
        )  # fmt: skip
    assert judge(watch, 62, OverUsePolicy.EVICT, at=62) == []
    assert judge(watch, 92, OverUsePolicy.EVICT, at=92) == ["train/0/evict", "train/1/evict"]


def test_the_episodes_of_a_node_whose_gpunode_is_gone_are_forgotten() -> None:
    watch = OverUseWatch()
    judge(watch, 0, OverUsePolicy.EVICT)
    watch.keep_nodes({"another"})
    assert judge(watch, 31, OverUsePolicy.EVICT, at=31) == []  # a new episode began at 31


def test_an_over_user_its_budgets_keep_is_deleted_once_the_admin_allows_it() -> None:
    def actions(watch: OverUseWatch, now: float, delete_after_s: float) -> list[str]:
        found = watch.observe(
            "n", measured(), measured_at=now, now=now, policy=OverUsePolicy.EVICT, grace_s=30,
            max_age_s=90, delete_after_s=delete_after_s,
        )  # fmt: skip
        for action in found:
            watch.retry_later(action, now, after_s=30, by_budget=True)  # every one refused
        return sorted(f"{a.use.card}/{'delete' if a.delete else 'evict'}" for a in found)

    never, after_60 = OverUseWatch(), OverUseWatch()
    for watch, delete_after_s in ((never, 0.0), (after_60, 60.0)):
        actions(watch, 0, delete_after_s)
        assert actions(watch, 30, delete_after_s) == ["0/evict", "1/evict"]  # refused from 30
        assert actions(watch, 60, delete_after_s) == ["0/evict", "1/evict"]
    assert actions(never, 90, 0.0) == ["0/evict", "1/evict"]  # the budgets always decide
    assert actions(after_60, 90, 60.0) == ["0/delete", "1/delete"]


def test_only_a_budgets_refusal_counts_toward_deleting() -> None:
    watch = OverUseWatch()
    for now in (0, 30, 60, 90):
        found = watch.observe(
            "n", measured(), measured_at=now, now=now, policy=OverUsePolicy.EVICT, grace_s=30,
            max_age_s=90, delete_after_s=1,
        )  # fmt: skip
        assert not any(action.delete for action in found)
        for action in found:
            watch.retry_later(action, now, after_s=30)  # fenced, or the apiserver out of reach


def test_refusals_count_toward_deleting_only_while_evictions_are_asked() -> None:
    watch = OverUseWatch()

    def act(now: float, policy: OverUsePolicy) -> list[str]:
        found = watch.observe(
            "n", measured(), measured_at=now, now=now, policy=policy, grace_s=30, max_age_s=90,
            delete_after_s=60,
        )  # fmt: skip
        for action in found:
            watch.retry_later(action, now, after_s=30, by_budget=action.evict)
        return sorted({"delete" if a.delete else "evict" if a.evict else "warn" for a in found})

    act(0, OverUsePolicy.EVICT)
    assert act(30, OverUsePolicy.EVICT) == ["evict"]  # refused from 30
    assert act(60, OverUsePolicy.WARN) == ["warn"]  # the admin turned evictions off
    assert act(120, OverUsePolicy.EVICT) == ["evict"]  # refused anew from 120, not from 30
    assert act(180, OverUsePolicy.EVICT) == ["delete"]
