"""Preemption against brute force: on small clusters (a few cards, up to 10 pods each) every
set of pods is tried, and the model's choice must be feasible and as cheap as the cheapest."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import chain, combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.model import (
    Allocation,
    Card,
    CardIndex,
    GpuKind,
    Ledger,
    NodeInventory,
    NodeName,
    PodRef,
    PodRequest,
    PodUid,
    find_placement,
)
from gpushare.model.disruption import Budget, breach
from gpushare.model.inventory import InventorySource
from gpushare.model.preemption import (
    Cost,
    Evictable,
    Evictables,
    GangHold,
    Preemption,
    View,
    cost_of,
    preempt,
    with_gangs,
)

NOW = 10_000.0


@dataclass(frozen=True)
class Cluster:
    ledger: Ledger
    view: View
    refused_node: NodeName | None
    """A node whose other filters refuse the pod unless `unblocker` is evicted too."""
    unblocker: PodUid | None


def memory(total: int) -> PodRequest:
    return PodRequest(kind=GpuKind.MEMORY, total=total, containers=())


def whole(count: int) -> PodRequest:
    return PodRequest(kind=GpuKind.NUMBER, total=count, containers=())


@st.composite
def clusters(draw: st.DrawFn) -> Cluster:
    ledger = Ledger()
    pods: dict[PodUid, Evictable] = {}
    serial = 0
    for n in range(draw(st.integers(1, 2))):
        name = NodeName(f"node-{n}")
        sizes = draw(st.lists(st.sampled_from([8, 10, 16]), min_size=1, max_size=3))
        cards = tuple(
            Card(index=CardIndex(i), memory=size, healthy=True) for i, size in enumerate(sizes)
        )
        ledger.set_node(
            NodeInventory(node=name, cards=cards, unit_mib=1, source=InventorySource.RESOURCE)
        )
        for card in cards:
            if draw(st.integers(0, 5)) == 0:  # a card held whole
                amounts, kind = [1], GpuKind.NUMBER
            else:
                amounts, kind = draw(st.lists(st.integers(1, 4), max_size=10)), GpuKind.MEMORY
            used = 0
            for amount in amounts:
                if kind is GpuKind.MEMORY and used + amount > card.memory:
                    break
                used += amount
                serial += 1
                uid = PodUid(f"uid-{serial:03d}")
                ref = PodRef(
                    namespace=draw(st.sampled_from(["a", "b"])), name=f"p{serial}", uid=uid
                )
                ledger.add(
                    Allocation(pod=ref, node=name, kind=kind, cards=(card.index,), amount=amount)
                )
                pods[uid] = Evictable(
                    ref=ref,
                    priority=draw(st.integers(0, 3)) * 10,
                    started_s=NOW - draw(st.integers(0, 5)) * 100,
                    labels={"app": draw(st.sampled_from(["x", "y"]))},
                    gang=draw(st.sampled_from([None, None, "g1", "g2"])),
                )
    gangs: dict[Hashable, GangHold] = {}
    for key in ("g1", "g2"):
        members = frozenset(uid for uid, pod in pods.items() if pod.gang == key)
        if members:
            gangs[key] = GangHold(members=members, spare=draw(st.integers(0, len(members))))
    budgets = [
        Budget(
            namespace=draw(st.sampled_from(["a", "b"])),
            name=f"pdb-{i}",
            match_labels={"app": draw(st.sampled_from(["x", "y"]))},
            allowed=draw(st.integers(0, 1)),
        )
        for i in range(draw(st.integers(0, 3)))
    ]
    refused = draw(st.sampled_from([None, NodeName("node-0")]))
    unblocker = draw(st.sampled_from([None, *sorted(pods)])) if refused else None
    table: Mapping[PodUid, Evictable] = pods
    if draw(st.booleans()):  # as the operator's cache keeps them: ranked as it changes
        table = Evictables()
        for uid, pod in pods.items():
            allocation = ledger.allocation(uid)
            assert allocation is not None
            table.put(pod, allocation.node, min(allocation.cards))
    view = View(
        pods=table, gangs=gangs, budgets=budgets, now_s=NOW, break_budgets=draw(st.booleans())
    )
    return Cluster(ledger, view, refused, unblocker)


def node_check(cluster: Cluster) -> Callable[[NodeName, frozenset[PodUid]], str | None]:
    def check(node: NodeName, victims: frozenset[PodUid]) -> str | None:
        if node == cluster.refused_node and cluster.unblocker not in victims:
            return "Insufficient cpu"
        return None

    return check


def subsets(items: list[PodUid]) -> Iterable[tuple[PodUid, ...]]:
    return chain.from_iterable(combinations(items, size) for size in range(len(items) + 1))


def eligible(cluster: Cluster, chosen: Iterable[PodUid], priority: int) -> frozenset[PodUid] | None:
    """The full set of victims if `chosen` may go, by the rules, brute force."""
    if any(cluster.view.pods[uid].priority >= priority for uid in chosen):
        return None
    victims = with_gangs(chosen, cluster.view, priority)
    if victims is None:
        return None
    pods = [cluster.view.pods[uid] for uid in victims]
    broken = breach(cluster.view.budgets, ((p.ref.namespace, p.labels) for p in pods))
    if broken.budgets and not cluster.view.break_budgets:
        return None
    return victims


def cheapest_memory(
    cluster: Cluster, need: int, priority: int
) -> tuple[Cost, str, tuple[int, ...]] | None:
    best = None
    for name, node in cluster.ledger.nodes().items():
        for index, usage in sorted(node.cards.items()):
            if usage.shareable and usage.free >= need:
                continue
            for chosen in subsets(sorted(usage.pods)):
                victims = eligible(cluster, chosen, priority)
                if victims is None or node_check(cluster)(name, victims):
                    continue
                held = [cluster.ledger.allocation(uid) for uid in usage.pods if uid not in victims]
                if any(a is not None and a.kind is GpuKind.NUMBER for a in held):
                    continue
                used = sum(a.amount for a in held if a is not None)
                if usage.card.memory - used < need:
                    continue
                key = (cost_of(victims, cluster.view), name, (index,))
                best = key if best is None or key < best else best
    return best


def cheapest_whole(
    cluster: Cluster, count: int, priority: int
) -> tuple[Cost, str, tuple[int, ...]] | None:
    best = None
    for name, node in cluster.ledger.nodes().items():
        if node.idle_cards >= count:
            continue
        for cards in combinations(sorted(node.cards), count):
            chosen = sorted({uid for index in cards for uid in node.cards[index].pods})
            victims = eligible(cluster, chosen, priority)
            if victims is None or node_check(cluster)(name, victims):
                continue
            key = (cost_of(victims, cluster.view), name, cards)
            best = key if best is None or key < best else best
    return best


def check_feasible(cluster: Cluster, found: Preemption, priority: int, request: PodRequest) -> None:
    """The victims are all of lower priority, break a budget only where the view allows it
    (and then the pods it covers are the ones deleted), and once they are gone the pod fits
    where the preemption says."""
    uids = [ref.uid for ref in found.victims]
    assert all(cluster.view.pods[uid].priority < priority for uid in uids)
    assert eligible(cluster, uids, priority) == frozenset(uids)
    pods = [cluster.view.pods[uid] for uid in uids]
    broken = breach(cluster.view.budgets, ((p.ref.namespace, p.labels) for p in pods))
    assert found.cost.past_budgets == broken.over
    assert found.budgets == broken.budgets
    assert {ref.uid for ref in found.past_budgets} == {
        p.ref.uid for p in pods if any(b.covers(p.ref.namespace, p.labels) for b in broken.budgets)
    }
    for uid in uids:
        cluster.ledger.release(uid)
    placement = find_placement(
        cluster.ledger,
        request,
        card_check=lambda node, card: (
            None if node == found.placement.node and card in found.placement.cards else "elsewhere"
        ),
    )
    assert placement is not None
    assert placement.cards == found.placement.cards


@settings(max_examples=300, deadline=None)
@given(clusters(), st.integers(1, 16), st.integers(0, 40))
def test_the_chosen_victims_make_room_and_none_cheaper_would(
    cluster: Cluster, need: int, priority: int
) -> None:
    found = preempt(
        cluster.ledger, memory(need), priority, cluster.view, node_check=node_check(cluster)
    )
    best = cheapest_memory(cluster, need, priority)
    if best is None:
        assert isinstance(found, str)
        return
    assert isinstance(found, Preemption), found
    assert (found.cost, found.placement.node, found.placement.cards) == best
    check_feasible(cluster, found, priority, memory(need))


@settings(max_examples=200, deadline=None)
@given(clusters(), st.integers(1, 3), st.integers(0, 40))
def test_whole_cards_are_freed_at_the_least_cost(
    cluster: Cluster, count: int, priority: int
) -> None:
    found = preempt(
        cluster.ledger, whole(count), priority, cluster.view, node_check=node_check(cluster)
    )
    best = cheapest_whole(cluster, count, priority)
    if best is None:
        assert isinstance(found, str)
        return
    assert isinstance(found, Preemption), found
    assert (found.cost, found.placement.node, found.placement.cards) == best
    check_feasible(cluster, found, priority, whole(count))


def one_card(memory: int) -> tuple[Ledger, NodeName]:
    """A ledger of node `n` with one healthy card of `memory`."""
    ledger = Ledger()
    node = NodeName("n")
    ledger.set_node(
        NodeInventory(
            node=node,
            cards=(Card(index=CardIndex(0), memory=memory, healthy=True),),
            unit_mib=1,
            source=InventorySource.RESOURCE,
        )
    )
    return ledger, node


def test_pods_of_equal_priority_are_never_victims() -> None:
    ledger, node = one_card(10)
    ref = PodRef(namespace="a", name="peer", uid=PodUid("u1"))
    ledger.add(
        Allocation(pod=ref, node=node, kind=GpuKind.MEMORY, cards=(CardIndex(0),), amount=10)
    )
    view = View(pods={ref.uid: Evictable(ref=ref, priority=100, started_s=0.0)})
    found = preempt(ledger, memory(4), 100, view, node_check=lambda _n, _v: None)
    assert found == "no card would take it with pods of lower priority gone"


def test_a_pod_asking_for_more_cards_than_a_node_has_gets_a_reason_not_a_crash() -> None:
    # itertools.combinations allocates its index array at the size asked for: a pod with
    # gpu-number 2**40 (the apiserver accepts it) once took the operator down with MemoryError.
    ledger, node = one_card(10)
    ref = PodRef(namespace="a", name="low", uid=PodUid("u1"))
    ledger.add(Allocation(pod=ref, node=node, kind=GpuKind.NUMBER, cards=(CardIndex(0),), amount=1))
    view = View(pods={ref.uid: Evictable(ref=ref, priority=0, started_s=0.0)})
    found = preempt(ledger, whole(2**40), 100, view, node_check=lambda _n, _v: None)
    assert isinstance(found, str), found


def two_cards(
    placed: Iterable[tuple[str, int, int, dict[str, str]]],
) -> tuple[Ledger, dict[PodUid, Evictable]]:
    """Node `n` with two cards of 10, and pods (name, card, amount, labels) of priority 0 in
    namespace `a` on them."""
    ledger = Ledger()
    node = NodeName("n")
    ledger.set_node(
        NodeInventory(
            node=node,
            cards=(
                Card(index=CardIndex(0), memory=10, healthy=True),
                Card(index=CardIndex(1), memory=10, healthy=True),
            ),
            unit_mib=1,
            source=InventorySource.RESOURCE,
        )
    )
    pods: dict[PodUid, Evictable] = {}
    for name, card, amount, labels in placed:
        ref = PodRef(namespace="a", name=name, uid=PodUid(name))
        ledger.add(
            Allocation(
                pod=ref, node=node, kind=GpuKind.MEMORY, cards=(CardIndex(card),), amount=amount
            )
        )
        pods[ref.uid] = Evictable(ref=ref, priority=0, started_s=0.0, labels=labels)
    return ledger, pods


DB_BUDGET = Budget(namespace="a", name="db", match_labels={"app": "db"}, allowed=0)


def test_a_set_its_budgets_allow_goes_before_a_smaller_one_that_breaks_a_budget() -> None:
    ledger, pods = two_cards(
        (
            ("big", 0, 8, {"app": "db"}),
            ("small-1", 0, 2, {"app": "web"}),
            ("half-1", 1, 5, {"app": "web"}),
            ("half-2", 1, 5, {"app": "web"}),
        )
    )
    found = preempt(
        ledger, memory(8), 10, View(pods=pods, budgets=[DB_BUDGET]), node_check=lambda _n, _v: None
    )
    assert isinstance(found, Preemption)
    assert [ref.name for ref in found.victims] == ["half-1", "half-2"]
    assert found.placement.cards == (1,)
    assert found.past_budgets == ()


def test_a_budget_is_broken_only_when_no_set_it_allows_makes_room_and_never_by_moving() -> None:
    # kube-scheduler's rule: a tenant's budget cannot keep its pods of low priority from
    # every pod of higher priority. Defragmentation moves pods only as budgets allow.
    ledger, pods = two_cards(
        (("big", 0, 8, {"app": "db"}), ("web", 0, 2, {"app": "web"}), ("other", 1, 10, {}))
    )
    pods[PodUid("other")] = replace(pods[PodUid("other")], priority=10)
    found = preempt(
        ledger, memory(8), 10, View(pods=pods, budgets=[DB_BUDGET]), node_check=lambda _n, _v: None
    )
    assert isinstance(found, Preemption)
    assert [ref.name for ref in found.victims] == ["big"]
    assert [ref.name for ref in found.past_budgets] == ["big"]
    assert found.budgets == (DB_BUDGET,)
    assert found.cost.past_budgets == 1
    kept = View(pods=pods, budgets=[DB_BUDGET], break_budgets=False)
    refused = preempt(ledger, memory(8), 10, kept, node_check=lambda _n, _v: None)
    assert refused == "the pods that would make room are protected by PodDisruptionBudget a/db"


def test_a_card_with_too_many_sets_to_try_still_finds_one_every_budget_allows() -> None:
    # 25 pods: more sets than MAX_SETS. Largest first, every set tried would hold the pod
    # its budget keeps, and the one that breaks it would win; w00..w04 break none.
    ledger, node = one_card(101)
    pods: dict[PodUid, Evictable] = {}
    for name, amount, app in [("db", 5, "db"), *((f"w{i:02d}", 4, "web") for i in range(24))]:
        ref = PodRef(namespace="a", name=name, uid=PodUid(name))
        ledger.add(
            Allocation(
                pod=ref, node=node, kind=GpuKind.MEMORY, cards=(CardIndex(0),), amount=amount
            )
        )
        pods[ref.uid] = Evictable(ref=ref, priority=0, started_s=0.0, labels={"app": app})
    view = View(pods=pods, budgets=[DB_BUDGET])
    found = preempt(ledger, memory(20), 10, view, node_check=lambda _n, _v: None)
    assert isinstance(found, Preemption)
    assert [ref.name for ref in found.victims] == ["w00", "w01", "w02", "w03", "w04"]
    assert found.past_budgets == ()


def test_the_next_choice_of_one_plan_weighs_the_budgets_and_gangs_as_the_last_left_them() -> None:
    # A gang's two members, each needing a card: the budget lets one db pod go. The first
    # member takes db-0; for the second, db-1 would now break the budget, so w1 and w2 go.
    ledger = Ledger()
    node = NodeName("n")
    ledger.set_node(
        NodeInventory(
            node=node,
            cards=tuple(Card(index=CardIndex(i), memory=10, healthy=True) for i in range(3)),
            unit_mib=1,
            source=InventorySource.RESOURCE,
        )
    )
    pods: dict[PodUid, Evictable] = {}
    for name, card, amount, app in (
        ("db-0", 0, 10, "db"),
        ("db-1", 1, 10, "db"),
        ("w1", 2, 5, "web"),
        ("w2", 2, 5, "web"),
    ):
        ref = PodRef(namespace="a", name=name, uid=PodUid(name))
        ledger.add(
            Allocation(
                pod=ref, node=node, kind=GpuKind.MEMORY, cards=(CardIndex(card),), amount=amount
            )
        )
        pods[ref.uid] = Evictable(ref=ref, priority=0, started_s=0.0, labels={"app": app})
    budget = replace(DB_BUDGET, allowed=1)
    view = View(pods=pods, budgets=[budget])
    chosen = []
    for member in ("m1", "m2"):
        found = preempt(ledger, memory(10), 10, view, node_check=lambda _n, _v: None)
        assert isinstance(found, Preemption)
        chosen.append(([ref.name for ref in found.victims], found.past_budgets))
        for ref in found.victims:
            ledger.release(ref.uid)
        ledger.add(
            found.placement.allocation(PodRef(namespace="g", name=member, uid=PodUid(member)))
        )
        view = view.without(frozenset(ref.uid for ref in found.victims))
    assert chosen == [(["db-0"], ()), (["w1", "w2"], ())]
    gangs: Mapping[Hashable, GangHold] = {
        "job": GangHold(members=frozenset({PodUid("w1"), PodUid("w2")}), spare=1)
    }
    left = View(pods=pods, gangs=gangs).without(frozenset({PodUid("w1")}))
    assert left.gangs == {"job": GangHold(members=frozenset({PodUid("w2")}), spare=0)}


def test_a_gang_member_below_its_minimum_takes_its_whole_gang() -> None:
    ledger = Ledger()
    node = NodeName("n")
    ledger.set_node(
        NodeInventory(
            node=node,
            cards=(
                Card(index=CardIndex(0), memory=10, healthy=True),
                Card(index=CardIndex(1), memory=10, healthy=True),
            ),
            unit_mib=1,
            source=InventorySource.RESOURCE,
        )
    )
    pods: dict[PodUid, Evictable] = {}
    for name, card, gang in (("m1", 0, "job"), ("m2", 1, "job"), ("m3", 1, "job")):
        ref = PodRef(namespace="a", name=name, uid=PodUid(name))
        ledger.add(
            Allocation(
                pod=ref,
                node=node,
                kind=GpuKind.MEMORY,
                cards=(CardIndex(card),),
                amount=10 if card == 0 else 5,
            )
        )
        pods[ref.uid] = Evictable(ref=ref, priority=0, started_s=0.0, gang=gang)
    gangs: Mapping[Hashable, GangHold] = {"job": GangHold(members=frozenset(pods), spare=0)}
    found = preempt(
        ledger, memory(10), 10, View(pods=pods, gangs=gangs), node_check=lambda _n, _v: None
    )
    assert isinstance(found, Preemption)
    assert [ref.name for ref in found.victims] == ["m1", "m2", "m3"]
