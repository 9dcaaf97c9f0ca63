"""Reading PodGroups and their pods, and the status written back, as Volcano's and the
scheduler-plugins' tools read it."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.model.gangs import (
    GroupApi,
    GroupKey,
    GroupSpec,
    GroupState,
    InvalidGroup,
    Members,
    group_of,
    group_spec,
    group_status,
    held_min_member,
    missing_members,
)

NOW = "2026-12-04T12:00:00Z"
EARLIER = "2026-12-04T11:00:00Z"


def podgroup(spec: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": "job", "namespace": "ml"}, "spec": spec}
    if status is not None:
        body["status"] = status
    return body


def test_a_pod_names_its_group_by_volcanos_annotation_or_the_coscheduling_label() -> None:
    volcano = {
        "metadata": {"namespace": "ml", "annotations": {"scheduling.k8s.io/group-name": "j"}}
    }
    older = {
        "metadata": {"namespace": "ml", "annotations": {"scheduling.volcano.sh/group-name": "j"}}
    }
    label = {"metadata": {"namespace": "ml", "labels": {"scheduling.x-k8s.io/pod-group": "j"}}}
    assert group_of(volcano) == GroupKey(GroupApi.VOLCANO, "ml", "j")
    assert group_of(older) == GroupKey(GroupApi.VOLCANO, "ml", "j")
    assert group_of(label) == GroupKey(GroupApi.COSCHEDULING, "ml", "j")
    assert group_of({"metadata": {"name": "alone"}}) is None


@pytest.mark.parametrize("bad", [0, -1, "4", 2.5, True])
def test_a_min_member_below_one_or_not_whole_is_refused_naming_the_podgroup(bad: object) -> None:
    with pytest.raises(InvalidGroup, match=r"PodGroup ml/job: minMember .* set spec.minMember"):
        group_spec(GroupApi.VOLCANO, podgroup({"minMember": bad}))


def test_unreadable_min_resources_and_timeouts_are_refused() -> None:
    with pytest.raises(InvalidGroup, match="minResources"):
        group_spec(GroupApi.VOLCANO, podgroup({"minMember": 2, "minResources": {"cpu": "lots"}}))
    with pytest.raises(InvalidGroup, match="scheduleTimeoutSeconds 0"):
        group_spec(GroupApi.COSCHEDULING, podgroup({"minMember": 2, "scheduleTimeoutSeconds": 0}))


def test_a_podgroup_as_volcanos_docs_show_it_reads_whole() -> None:
    spec = group_spec(
        GroupApi.VOLCANO,
        podgroup(
            {
                "minMember": 1,
                "minResources": {"cpu": "3", "memory": "2048Mi"},
                "priorityClassName": "high-prority",
                "queue": "default",
            }
        ),
    )
    assert spec.min_member == 1
    assert not spec.is_gang
    assert spec.min_resources == {"cpu": 3000, "memory": 2048 * 2**20}
    assert spec.priority_class == "high-prority"


def test_a_gang_short_of_members_says_how_many_exist_of_how_many() -> None:
    spec = group_spec(GroupApi.VOLCANO, podgroup({"minMember": 4}))
    message = missing_members(spec, Members(pending=2, bound=1, running=0, succeeded=0, failed=0))
    assert message is not None
    assert "3 of minMember 4 pods exist (1 bound, 2 pending)" in message
    assert missing_members(spec, Members(3, 1, 0, 0, 0)) is None


def volcano_status(spec: GroupSpec, members: Members, reason: str | None = None) -> dict[str, Any]:
    return group_status(spec, GroupState(members, enqueued=True, reason=reason), NOW)


def test_volcano_phases_go_pending_inqueue_running_completed() -> None:
    spec = group_spec(GroupApi.VOLCANO, podgroup({"minMember": 2}))
    blocked = group_status(spec, GroupState(Members(0, 0, 0, 0, 0), False, "no room"), NOW)
    assert blocked["phase"] == "Pending"
    assert volcano_status(spec, Members(0, 0, 0, 0, 0))["phase"] == "Inqueue"
    assert volcano_status(spec, Members(0, 2, 1, 0, 0))["phase"] == "Inqueue"
    assert volcano_status(spec, Members(0, 2, 2, 0, 0))["phase"] == "Running"
    done = volcano_status(spec, Members(0, 0, 0, 2, 0))
    assert (done["phase"], done["succeeded"]) == ("Completed", 2)


def test_volcanos_unschedulable_condition_keeps_its_transition_time_while_it_holds() -> None:
    before = {
        "phase": "Inqueue",
        "conditions": [{"type": "Unschedulable", "status": "True", "lastTransitionTime": EARLIER}],
    }
    spec = group_spec(GroupApi.VOLCANO, podgroup({"minMember": 2}, before))
    status = volcano_status(spec, Members(2, 0, 0, 0, 0), reason="pod ml/a does not fit")
    (condition,) = status["conditions"]
    assert condition["type"] == "Unschedulable"
    assert condition["lastTransitionTime"] == EARLIER
    assert condition["message"] == "pod ml/a does not fit"
    (placed,) = volcano_status(spec, Members(0, 2, 0, 0, 0))["conditions"]
    assert (placed["type"], placed["lastTransitionTime"]) == ("Scheduled", NOW)


def test_coscheduling_phases_and_schedule_start_time() -> None:
    spec = group_spec(GroupApi.COSCHEDULING, podgroup({"minMember": 3}))
    waiting = group_status(spec, GroupState(Members(2, 0, 0, 0, 0), True, "short"), NOW)
    assert waiting == {
        "phase": "Pending",
        "running": 0,
        "succeeded": 0,
        "failed": 0,
        "scheduleStartTime": NOW,
    }
    assert group_status(spec, GroupState(Members(0, 3, 0, 0, 0), True, None), NOW)["phase"] == (
        "Scheduled"
    )
    assert group_status(spec, GroupState(Members(0, 3, 3, 0, 0), True, None), NOW)["phase"] == (
        "Running"
    )


@pytest.mark.parametrize(
    ("min_member", "bound_under", "held"),
    [
        (4, [4, 4, 4, 4], 4),  # placed whole
        (8, [4, 4, 4, 4, 8], 4),  # raised, then one more bound: one says 8, four say 4
        (2, [4, 4, 4, 4], 2),  # lowered since: the PodGroup's
        (3, [], 3),  # nothing says: the PodGroup's
        (9, [1] * 8 + [9], 1),
    ],
)
def test_a_gang_is_held_to_as_many_as_were_bound_under_that_many(
    min_member: int, bound_under: list[int], held: int
) -> None:
    assert held_min_member(min_member, bound_under) == held
