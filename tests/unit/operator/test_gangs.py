"""The gang decision: all of a gang's minimum placed at once, or nothing held."""

from __future__ import annotations

from builders import capacity_node, gpu_pod

from gpushare.model import CardIndex, NodeName, PodUid, Policy, contract
from gpushare.model.gangs import VOLCANO_GROUP_ANNOTATIONS, GroupApi, GroupSpec
from gpushare_operator.config import OperatorConfig
from gpushare_operator.scheduling.cache import SchedulerCache
from gpushare_operator.scheduling.decision import Refusal
from gpushare_operator.scheduling.gangs import GangBook, GangDecision, broken_gang, decide_gang
from gpushare_operator.scheduling.podinfo import PodInfo
from gpushare_operator.scheduling.preemption import Room, gang_holds, make_room_for_gang

CONFIG = OperatorConfig(scheduler_names=frozenset({"volcano"}))


def cluster() -> tuple[SchedulerCache, GangBook]:
    cache = SchedulerCache(config=lambda: CONFIG, clock=lambda: 1000.0)
    node = capacity_node("n", 40000, 2)  # two cards of 20000 MiB
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    node["status"]["allocatable"] = {**node["status"]["capacity"], "pods": "110"}
    cache.observe_node(node)
    return cache, GangBook()


def add_gang(cache: SchedulerCache, book: GangBook, name: str, size: int, mib: int) -> None:
    book.observe_group(
        GroupApi.VOLCANO,
        {"metadata": {"name": name, "namespace": "default"}, "spec": {"minMember": size}},
    )
    for index in range(size):
        body = gpu_pod(f"{name}{index}", mib, uid=f"{name}-{index}")
        body["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[0]: name}
        body["metadata"]["creationTimestamp"] = f"2026-12-04T10:00:0{index}Z"
        pod = PodInfo.parse(body)
        cache.observe_pod(pod)
        book.observe_member(pod)


def used(cache: SchedulerCache) -> list[int]:
    usage = cache.ledger.node(NodeName("n"))
    assert usage is not None
    return [usage.cards[CardIndex(i)].used for i in range(2)]


def decide(cache: SchedulerCache, book: GangBook, name: str) -> GangDecision:
    return decide_gang(cache, book, spec_of(book, name), Policy.BESTFIT, timeout_s=300, waited={})


def spec_of(book: GangBook, name: str) -> GroupSpec:
    (spec,) = [s for s in book.specs() if s.key.name == name]
    return spec


def test_a_gang_that_fits_is_placed_whole_with_same_size_members_waiting_on_their_cards() -> None:
    cache, book = cluster()
    add_gang(cache, book, "a", 4, 9000)
    decision = decide_gang(
        cache, book, spec_of(book, "a"), Policy.BESTFIT, timeout_s=300, waited={}
    )
    # Two on card 0 now; two on card 1 once the device plugin has assigned the first two
    # (the exactness rule), counted placed meanwhile.
    assert [pod.ref.name for pod, _ in decision.placed] == ["a0", "a1"]
    waiting = [(pod.ref.name, refusal.quiet) for pod, refusal in decision.refused]
    assert waiting == [("a2", True), ("a3", True)]
    assert used(cache) == [18000, 0]  # the scheduler reserves card 1 as it parks them
    verdict = book.verdict(spec_of(book, "a").key)
    assert verdict is not None
    assert verdict.reason is None


def test_a_gang_that_does_not_fit_holds_nothing_and_says_which_member_and_why() -> None:
    cache, book = cluster()
    add_gang(cache, book, "big", 3, 15000)  # one pod per card: two cards, three pods
    decision = decide(cache, book, "big")
    assert decision.placed == []
    assert used(cache) == [0, 0]
    messages = {refusal.message for _, refusal in decision.refused}
    (message,) = messages
    assert message.startswith(
        "gang PodGroup default/big: only 2 of minMember 3 pods can be placed together now "
        "(0 bound); pod default/big2 does not fit:"
    )
    assert len(decision.refused) == 3


def test_a_gang_below_its_minimum_before_it_ran_evicts_only_controlled_members() -> None:
    cache, book = cluster()
    add_gang(cache, book, "g", 2, 1000)
    decision = decide_gang(
        cache, book, spec_of(book, "g"), Policy.BESTFIT, timeout_s=300, waited={}
    )
    assert len(decision.placed) == 2
    _, (second, _) = decision.placed
    book.forget_member(second.uid)
    cache.forget_pod(second.uid)
    assert broken_gang(cache, book, spec_of(book, "g").key) == []  # a bare pod: kept
    verdict = book.verdict(spec_of(book, "g").key)
    assert verdict is not None
    assert verdict.reason is not None
    assert "kept 1 bound pod(s) that no controller owns" in verdict.reason


def test_a_gangs_members_go_at_its_podgroups_class_up_to_what_a_member_was_admitted_with() -> None:
    cache, book = cluster()
    add_gang(cache, book, "g", 2, 1000)
    book.observe_group(
        GroupApi.VOLCANO,
        {
            "metadata": {"name": "g", "namespace": "default"},
            "spec": {"minMember": 2, "priorityClassName": "high"},
        },
    )
    first, second = book.members(spec_of(book, "g").key)
    book.observe_priority_class("high", 1000)
    # No member was admitted above 0: the PodGroup's class lifts nobody.
    assert book.priority_of(first) == 0
    # One member was admitted at 1000 (its own class, through the Priority plugin): the gang
    # goes at it, the class's value, and no higher.
    body = gpu_pod("g0", 1000, uid="g-0")
    body["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[0]: "g"}
    body["spec"]["priority"] = 5000
    book.observe_member(PodInfo.parse(body))
    assert book.priority_of(second) == 1000
    book.observe_priority_class("high", 100_000)
    assert book.priority_of(second) == 5000
    book.forget_priority_class("high")
    assert book.priority_of(second) == 0


def test_a_podgroup_cannot_lift_its_gang_to_a_class_its_pods_were_not_admitted_with() -> None:
    cache, book = cluster()
    add_gang(cache, book, "g", 2, 1000)
    book.observe_group(
        GroupApi.VOLCANO,
        {
            "metadata": {"name": "g", "namespace": "default"},
            "spec": {"minMember": 2, "priorityClassName": "system-cluster-critical"},
        },
    )
    book.observe_priority_class("system-cluster-critical", 2_000_000_000)
    (member, *_) = book.members(spec_of(book, "g").key)
    assert book.priority_of(member) == 0  # its pods' own priority


def bound_member(
    cache: SchedulerCache,
    book: GangBook,
    name: str,
    *,
    group: str = "job",
    record: str | None = None,
    gpu: bool = True,
    owner: str | None = None,
) -> None:
    """A member bound to node n (card 0 unless `gpu` is False), labelled a GPU pod, with
    `record` as its gang-min-member annotation."""
    body = gpu_pod(name, 1000 if gpu else None, node="n", index="0" if gpu else None, uid=name)
    body["metadata"]["annotations"][VOLCANO_GROUP_ANNOTATIONS[0]] = group
    if record is not None:
        body["metadata"]["annotations"][contract.GANG_MIN_MEMBER] = record
    body["metadata"]["labels"] = dict(contract.GPU_POD_LABELS)
    if owner is not None:
        body["metadata"]["ownerReferences"] = [{"uid": owner, "controller": True}]
    pod = PodInfo.parse(body)
    cache.observe_pod(pod)
    book.observe_member(pod)


def group(book: GangBook, name: str, min_member: int) -> None:
    book.observe_group(
        GroupApi.VOLCANO,
        {"metadata": {"name": name, "namespace": "default"}, "spec": {"minMember": min_member}},
    )


def spare(cache: SchedulerCache, book: GangBook, name: str) -> int:
    (hold,) = [h for key, h in gang_holds(cache, book).items() if key.name == name]  # type: ignore[attr-defined]
    return hold.spare


def test_a_gang_is_held_to_the_minmember_its_members_were_bound_under() -> None:
    cache, book = cluster()
    for index in range(4):
        bound_member(cache, book, f"m{index}", record="3")
    group(book, "job", 4)  # raised by its tenant after the binds
    assert spare(cache, book, "job") == 1
    group(book, "job", 2)  # lowered: that counts
    assert spare(cache, book, "job") == 2


def test_records_nobody_guards_do_not_count() -> None:
    cache, book = cluster()
    for index in range(4):
        bound_member(cache, book, f"m{index}", record="2")
    for index in range(4):  # anyone may label a pod without a GPU: nothing guards its record
        bound_member(cache, book, f"cpu{index}", record="8", gpu=False)
    group(book, "job", 8)
    assert spare(cache, book, "job") == 6  # eight bound, held to 2


def test_a_record_that_cannot_be_read_says_the_least() -> None:
    cache, book = cluster()
    for index in range(3):
        bound_member(cache, book, f"m{index}", record="\u00b2")  # a digit to str.isdigit only
    group(book, "job", 3)
    assert spare(cache, book, "job") == 2


def test_a_member_without_a_card_does_not_keep_its_gang_from_being_taken_whole() -> None:
    cache, book = cluster()
    for index in range(4):
        bound_member(cache, book, f"m{index}", record="4")
    bound_member(cache, book, "driver", gpu=False)
    group(book, "job", 4)
    (hold,) = gang_holds(cache, book).values()
    assert hold.members == {PodUid(f"m{index}") for index in range(4)}
    assert hold.spare == 1


def test_volcanos_default_gang_joined_after_the_bind_is_held_to_one() -> None:
    cache, book = cluster()
    for index in range(3):
        bound_member(cache, book, f"r{index}", group="podgroup-rs-1", owner="rs-1")
    group(book, "podgroup-rs-1", 3)  # Volcano makes it with minMember 1
    assert spare(cache, book, "podgroup-rs-1") == 2


def test_a_gang_bound_before_the_record_was_written_is_held_to_its_podgroup() -> None:
    cache, book = cluster()
    for index in range(3):
        bound_member(cache, book, f"m{index}")
    group(book, "job", 3)
    assert spare(cache, book, "job") == 0


def test_one_member_bound_after_a_raise_does_not_hold_the_whole_gang_to_it() -> None:
    cache, book = cluster()
    for index in range(8):
        bound_member(cache, book, f"m{index}", record="1")  # placed one by one
    bound_member(cache, book, "late", record="9")  # bound once its tenant raised minMember
    group(book, "job", 9)
    assert spare(cache, book, "job") == 8


def test_a_gang_bound_before_the_record_keeps_its_podgroups_hold_when_a_member_is_rebound() -> None:
    cache, book = cluster()
    for index in range(7):
        bound_member(cache, book, f"m{index}")
    bound_member(cache, book, "again", record="8")
    group(book, "job", 8)
    assert spare(cache, book, "job") == 0


def test_a_gangs_members_preempt_within_a_budget_together() -> None:
    # Card 0 holds db-0 and db-1, card 1 w1 and w2, all of priority 0; the budget lets one
    # db pod go. The gang's two members each need half a card: one db pod, then a web pod.
    cache, book = cluster()
    for name, card, app in (
        ("db-0", "0", "db"),
        ("db-1", "0", "db"),
        ("w1", "1", "web"),
        ("w2", "1", "web"),
    ):
        body = gpu_pod(name, 10000, node="n", index=card, uid=name, phase="Running")
        body["metadata"]["labels"] = {"app": app}
        body["metadata"]["annotations"][contract.GPU_ASSIGNED] = contract.GPU_ASSIGNED_TRUE
        body["metadata"]["creationTimestamp"] = "2026-12-04T09:00:00Z"
        cache.observe_pod(PodInfo.parse(body))
    cache.observe_budget(
        {
            "metadata": {"name": "keep-db", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "db"}}},
            "status": {"disruptionsAllowed": 1},
        }
    )
    group(book, "job", 2)
    refused = []
    for index in range(2):
        body = gpu_pod(f"m{index}", 10000, uid=f"m{index}")
        body["metadata"]["annotations"] = {VOLCANO_GROUP_ANNOTATIONS[0]: "job"}
        body["spec"]["priority"] = 100
        pod = PodInfo.parse(body)
        cache.observe_pod(pod)
        book.observe_member(pod)
        refused.append((pod, Refusal("no card has room")))
    outcomes = make_room_for_gang(
        cache, book, spec_of(book, "job"), refused, priority=100, policy=Policy.BESTFIT
    )
    rooms = [outcome for _, outcome in outcomes if isinstance(outcome, Room)]
    victims = sorted(ref.name for room in rooms for ref in room.preemption.victims)
    assert victims == ["db-0", "w1"]
    assert all(room.preemption.past_budgets == () for room in rooms)  # all evicted: none deleted
