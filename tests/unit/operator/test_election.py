"""Leader election judged by each replica's own elapsed time, never by another's clock."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from leases import LEASE_LABEL, OneLease

from gpushare.kube import ApiError
from gpushare.model import contract
from gpushare_operator.config import OperatorConfig
from gpushare_operator.election import FENCE_LOAD_S, LeaseElector, WriteFence
from gpushare_operator.kubeapi import TermStamp

pytestmark = pytest.mark.asyncio

LEASE = "gpushare-system/gpushare-scheduler"  # the default Lease, its namespace and name


def replica(
    api: OneLease,
    identity: str,
    wall: list[float],
    elapsed: list[float],
    on_started: Callable[[], None] = lambda: None,
) -> LeaseElector:
    config = OperatorConfig(identity=identity, lease_duration_s=15, renew_deadline_s=10)
    return LeaseElector(
        api,  # type: ignore[arg-type]  # the Lease's and the fence's calls are all it makes
        config=lambda: config,
        on_started_leading=on_started,
        on_stopped_leading=lambda: None,
        clock=lambda: wall[0],
        monotonic=lambda: elapsed[0],
    )


async def test_a_standby_whose_clock_runs_ahead_does_not_take_a_live_lease() -> None:
    api = OneLease()
    leader = replica(api, "a", wall=[1000.0], elapsed=[0.0])
    await leader.step()
    assert leader.leading
    standby_elapsed = [0.0]
    standby = replica(api, "b", wall=[1000.0 + 3600], elapsed=standby_elapsed)  # an hour ahead
    await standby.step()
    assert not standby.leading
    for _ in range(5):  # the leader renews; the standby's own time passes
        standby_elapsed[0] += 5
        await leader.step()
        await standby.step()
        assert not standby.leading


async def test_a_standby_whose_clock_runs_behind_takes_a_lease_left_unrenewed() -> None:
    api = OneLease()
    leader = replica(api, "a", wall=[1000.0], elapsed=[0.0])
    await leader.step()
    standby_elapsed = [0.0]
    standby = replica(api, "b", wall=[1000.0 - 3600], elapsed=standby_elapsed)  # an hour behind
    await standby.step()
    assert not standby.leading
    standby_elapsed[0] += 16  # the leader died: 16 s of the standby's time, no renewal
    await standby.step()
    assert standby.leading
    assert api.lease is not None
    assert api.lease["spec"]["holderIdentity"] == "b"


async def test_a_leader_paused_past_its_lease_may_not_write_until_it_has_renewed() -> None:
    api = OneLease()
    elapsed = [0.0]
    leader = replica(api, "a", wall=[1000.0], elapsed=elapsed)
    await leader.step()
    assert leader.fresh()
    elapsed[0] += 16  # SIGSTOPped past its 15 s Lease; a standby took it meanwhile
    standby_elapsed = [0.0]
    standby = replica(api, "b", wall=[1016.0], elapsed=standby_elapsed)
    await standby.step()
    standby_elapsed[0] += 16
    await standby.step()
    assert standby.leading
    # Resumed, "a" still believes it leads until its next round; it may not bind meanwhile.
    assert leader.leading
    assert not leader.fresh()
    await leader.step()
    assert not leader.leading
    assert not leader.fresh()


async def test_each_new_holder_writes_in_a_new_term_its_writes_are_stamped_with() -> None:
    api = OneLease()
    a_elapsed, b_elapsed = [0.0], [0.0]
    a = replica(api, "a", wall=[1000.0], elapsed=a_elapsed)
    b = replica(api, "b", wall=[1000.0], elapsed=b_elapsed)
    fence = WriteFence(a.fresh, lambda: a.term)
    await a.step()
    await a.step()  # renewals keep the term
    first = TermStamp(
        annotations={contract.LEADER_TERM: f"{LEASE}/a/0"},
        labels={contract.LEASE_LABEL: LEASE_LABEL, contract.LEASE_TERM_LABEL: "0.uid-1"},
    )
    assert fence.stamp() == first
    await b.step()
    b_elapsed[0] += 16  # "a" paused past its Lease: "b" takes it, in a term of its own
    await b.step()
    assert str(b.term) == f"{LEASE}/b/1"
    assert api.lease is not None
    assert api.lease["spec"]["leaseTransitions"] == 1
    # Resumed, "a" stamps its writes with the term that is over: the apiserver's binding
    # (gpushare-leader-writes) holds "b"'s and refuses them.
    assert fence.stamp() == first
    assert api.fence == (LEASE_LABEL, "1.uid-1")
    await a.step()  # "a" steps down and sees "b" hold the Lease
    a_elapsed[0] += 16  # "b" gone quiet in turn: "a" leads again, in a new term
    await a.step()
    assert a.leading
    assert fence.stamp().annotations == {contract.LEADER_TERM: f"{LEASE}/a/2"}
    assert fence.stamp().labels[contract.LEASE_TERM_LABEL] == "2.uid-1"
    assert WriteFence(lambda: True).stamp() == TermStamp()  # no leader election: no term


async def test_a_lease_given_up_on_shutdown_is_taken_in_a_new_term() -> None:
    api = OneLease()
    a = replica(api, "a", wall=[1000.0], elapsed=[0.0])
    b = replica(api, "b", wall=[1000.0], elapsed=[0.0])
    await a.step()
    await a.release()  # a clean shutdown: no holder, at once
    await b.step()
    assert b.leading
    assert str(b.term) == f"{LEASE}/b/1"
    await a.step()  # back, and standing by: the term stays b's
    assert not a.leading
    assert api.lease is not None
    assert api.lease["spec"]["leaseTransitions"] == 1


async def test_a_leader_paused_while_the_lease_changed_hands_twice_leads_afresh() -> None:
    api = OneLease()
    a_elapsed = [0.0]
    transitions: list[str] = []
    config = OperatorConfig(identity="a", lease_duration_s=15, renew_deadline_s=10)
    a = LeaseElector(
        api,  # type: ignore[arg-type]
        config=lambda: config,
        on_started_leading=lambda: transitions.append("started"),
        on_stopped_leading=lambda: transitions.append("stopped"),
        clock=lambda: 1000.0,
        monotonic=lambda: a_elapsed[0],
    )
    await a.step()
    b_elapsed = [0.0]
    b = replica(api, "b", wall=[1000.0], elapsed=b_elapsed)
    await b.step()
    b_elapsed[0] += 16  # "a" paused: "b" takes the Lease, then gives it up on shutdown
    await b.step()
    await b.release()
    a_elapsed[0] += 16  # "a" resumes and takes the free Lease in its first round
    await a.step()
    # Its decisions from before are of a term that is over: its leadership starts again
    # (the runtime cancels them and lists the pods again before deciding).
    assert transitions == ["started", "stopped", "started"]
    assert str(a.term) == f"{LEASE}/a/2"


async def test_a_new_leader_sets_its_term_on_the_fence_before_it_leads_and_not_at_renewals() -> (
    None
):
    api = OneLease()
    fence_when_started: list[tuple[str, str] | None] = []
    a = replica(api, "a", [1000.0], [0.0], on_started=lambda: fence_when_started.append(api.fence))
    for _ in range(3):
        await a.step()
    assert fence_when_started == [(LEASE_LABEL, "0.uid-1")]
    assert api.fence_writes == 1


@pytest.mark.parametrize("status", [403, 500])
@pytest.mark.parametrize("call", ["read", "patch"])
async def test_a_replica_that_cannot_set_its_term_on_the_fence_does_not_lead_until_it_can(
    status: int, call: str
) -> None:
    api = OneLease()
    error = ApiError(status, "validatingadmissionpolicybindings is forbidden")
    if call == "read":
        api.fence_error = error
    else:
        api.patch_error = error
    a = replica(api, "a", wall=[1000.0], elapsed=[0.0])
    await a.step()
    await a.step()
    assert not a.leading  # its writes would be refused: the binding holds another term
    assert api.fence == (LEASE_LABEL, "none")
    api.fence_error = api.patch_error = None  # the right granted, or the apiserver recovered
    await a.step()
    assert a.leading
    assert api.fence == (LEASE_LABEL, "0.uid-1")


async def test_a_replica_without_the_right_leads_if_the_apiserver_takes_its_writes() -> None:
    api = OneLease()
    api.fence = (LEASE_LABEL, "0.uid-1")  # the binding happens to hold its term
    api.fence_error = ApiError(403, "validatingadmissionpolicybindings is forbidden")
    a = replica(api, "a", wall=[1000.0], elapsed=[0.0])
    await a.step()
    assert a.leading


async def test_a_replica_holding_the_lease_without_leading_gives_it_up_on_shutdown() -> None:
    api = OneLease()
    api.fence_error = ApiError(403, "validatingadmissionpolicybindings is forbidden")
    a = replica(api, "a", wall=[1000.0], elapsed=[0.0])
    await a.step()
    assert not a.leading
    await a.release()
    assert api.lease is not None
    assert api.lease["spec"]["holderIdentity"] is None  # a standby need not wait it out


@pytest.mark.parametrize("fence", [None, ("elsewhere.lease", "none")])
async def test_without_a_fence_binding_of_its_lease_the_leader_leads_unfenced(
    fence: tuple[str, str] | None,
) -> None:
    api = OneLease()
    api.fence = fence  # none at all, or one that fences another Lease
    a = replica(api, "a", wall=[1000.0], elapsed=[0.0])
    await a.step()
    assert a.leading  # nothing refuses its writes: as before the policy was installed
    await a.step()
    assert api.fence_writes == 0
    assert api.fence == fence


async def test_a_replica_whose_renewal_raced_a_takeover_never_sets_its_term_back() -> None:
    api = OneLease()
    a = replica(api, "a", wall=[1000.0], elapsed=[0.0])
    await a.step()
    api.fence = (LEASE_LABEL, "none")  # set back by an apply: "a" sets its term next round

    def taken_over() -> None:  # "a" paused between its renewal and the fence: "b" took over
        api.fence = (LEASE_LABEL, "1.uid-1")
        api.meanwhile = lambda: None

    api.meanwhile = taken_over
    await a.step()
    assert api.fence == (LEASE_LABEL, "1.uid-1")  # a later term: left there
    assert not a.fresh()  # and no write sent in its own
    assert api.fence_writes == 1  # its first term's, none since


async def test_a_leader_whose_term_was_set_back_on_the_fence_sets_it_again() -> None:
    api = OneLease()
    a = replica(api, "a", wall=[1000.0], elapsed=[0.0])
    await a.step()
    api.fence = (LEASE_LABEL, "none")  # the admin applied the manifests again
    await a.step()  # each round asks whether the apiserver still takes its term
    assert a.leading
    assert api.fence == (LEASE_LABEL, "0.uid-1")
    api.fence = (LEASE_LABEL, "none")
    api.probe_says = True  # this round's check answered before the apply
    await a.step()
    assert api.fence == (LEASE_LABEL, "none")
    a.on_term_refused()  # then the apiserver refused a Binding of the term now
    assert not a.fresh()  # no more writes it would refuse
    await a.step()
    assert api.fence == (LEASE_LABEL, "0.uid-1")
    assert a.fresh()


async def test_a_new_leader_leads_once_the_apiserver_holds_its_term_and_not_before() -> None:
    api = OneLease()
    api.fence_lag = 3  # the apiserver rebuilds its policies a moment after the change
    lag_when_started: list[int] = []
    a = replica(
        api, "a", [1000.0], [0.0], on_started=lambda: lag_when_started.append(api.fence_lag)
    )
    await a.step()
    assert lag_when_started == [0]


async def test_on_a_fresh_install_the_leader_leads_once_the_apiserver_loads_the_fence() -> None:
    api = OneLease()
    api.fence_unloaded = 3  # the apiserver takes every write until it loads the new binding
    unloaded_when_started: list[int] = []
    a = replica(
        api,
        "a",
        [1000.0],
        [0.0],
        on_started=lambda: unloaded_when_started.append(api.fence_unloaded),
    )
    await a.step()
    assert unloaded_when_started == [0]
    assert a.fresh()


async def test_a_leader_whose_fence_the_apiserver_no_longer_enforces_stops_writing() -> None:
    api = OneLease()
    elapsed = [0.0]
    a = replica(api, "a", [1000.0], elapsed)
    await a.step()
    assert a.fresh()
    api.fence_unloaded = 1000  # the binding's term is right, but the apiserver holds none

    def a_second_passes() -> None:
        elapsed[0] += 1

    api.per_probe = a_second_passes
    await a.step()
    assert not a.fresh()


async def test_a_fence_the_apiserver_never_enforces_is_led_under_after_a_minute() -> None:
    api = OneLease()
    api.fence_unloaded = 10**6  # the binding holds the term, but its policy was deleted
    elapsed = [0.0]

    def five_seconds_pass() -> None:
        elapsed[0] += 5

    api.per_probe = five_seconds_pass
    a = replica(api, "a", wall=[1000.0], elapsed=elapsed)
    for _ in range(20):
        await a.step()
        if a.leading:
            break
    assert a.fresh()  # scheduling goes on, unfenced
    assert elapsed[0] >= FENCE_LOAD_S  # though not before a binding would have loaded
    assert api.fence == (LEASE_LABEL, "0.uid-1")


async def test_a_fence_seen_unenforced_in_an_earlier_term_lets_no_later_term_lead_unfenced() -> (
    None
):
    api = OneLease()
    a_elapsed = [0.0]
    config = OperatorConfig(identity="a", lease_duration_s=15, renew_deadline_s=10)
    a = LeaseElector(
        api,  # type: ignore[arg-type]
        config=lambda: config,
        on_started_leading=lambda: None,
        on_stopped_leading=lambda: None,
        clock=lambda: 1000.0,
        monotonic=lambda: a_elapsed[0],
        fence_wait_s=0,
    )
    await a.step()
    api.fence_unloaded = 4  # for a round, the apiserver enforces nothing (its policy reloaded)
    await a.step()
    assert not a.fresh()
    b_elapsed = [0.0]
    b = replica(api, "b", wall=[1000.0], elapsed=b_elapsed)
    await b.step()
    b_elapsed[0] += 16  # "b" takes the Lease, sets its term, then gives the Lease up
    await b.step()
    await b.release()
    a_elapsed[0] += 3600  # an hour later "a" takes it again; its first probe gets no answer

    def unanswered() -> None:
        api.per_probe = lambda: None
        raise ApiError(500, "etcdserver: request timed out")

    api.per_probe = unanswered
    await a.step()
    assert not a.fresh()  # what it saw an hour ago in another term is no answer now
    await a.step()
    assert a.fresh()
    assert api.fence == (LEASE_LABEL, "2.uid-1")


async def test_a_term_the_apiserver_does_not_hold_in_time_is_not_led_in_yet() -> None:
    api = OneLease()
    api.fence_lag = 2  # both asks of its first round are answered from the term before
    config = OperatorConfig(identity="a", lease_duration_s=15, renew_deadline_s=10)
    a = LeaseElector(
        api,  # type: ignore[arg-type]
        config=lambda: config,
        on_started_leading=lambda: None,
        on_stopped_leading=lambda: None,
        fence_wait_s=0,
    )
    await a.step()
    assert not a.leading
    await a.step()  # the next round finds its term held
    assert a.leading
    assert api.fence_writes == 1


async def test_a_replica_whose_renewal_runs_out_while_the_apiserver_lags_does_not_lead() -> None:
    api = OneLease()
    api.fence_lag = 1000  # the apiserver never takes the new term
    elapsed = [0.0]

    def a_second_passes() -> None:
        elapsed[0] += 1

    api.per_probe = a_second_passes
    a = replica(api, "a", wall=[1000.0], elapsed=elapsed)
    await a.step()
    assert not a.leading
    assert elapsed[0] <= 6  # within half the renew deadline (10 s): the next round renews


async def test_a_fence_binding_of_another_shape_is_led_under_only_if_it_takes_the_writes() -> None:
    api = OneLease()
    api.probe_says = False  # it fences this Lease, in a shape the operator cannot set

    async def reversed_requirements() -> list[dict[str, Any]]:
        return [
            {"key": contract.LEASE_TERM_LABEL, "operator": "NotIn", "values": ["none"]},
            {"key": contract.LEASE_LABEL, "operator": "In", "values": [LEASE_LABEL]},
        ]

    api.read_fence = reversed_requirements  # type: ignore[method-assign]
    a = LeaseElector(
        api,  # type: ignore[arg-type]
        config=lambda: OperatorConfig(identity="a", lease_duration_s=15, renew_deadline_s=10),
        on_started_leading=lambda: None,
        on_stopped_leading=lambda: None,
        fence_wait_s=0,
    )
    await a.step()
    assert not a.leading
    api.probe_says = True  # the admin mended it, or removed it
    await a.step()
    assert a.leading


class LoadingFence(OneLease):
    """A fresh install's binding as the apiserver loads it while a new leader asks, one load a
    question: not at all (it takes every write), then as created (term `none`: it refuses
    every write of the Lease), then with the term the leader set."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = ["unloaded", "none"]
        self.loaded = "unloaded"

    async def fence_holds(self, namespace: str, stamp: TermStamp) -> bool:
        assert self.fence is not None
        self.loaded = self.loads.pop(0) if self.loads else self.fence[1]
        return self.loaded == "unloaded" or stamp.labels[contract.LEASE_TERM_LABEL] == self.loaded


async def test_a_new_leader_leads_once_the_apiserver_holds_its_term_though_it_loads_mid_ask() -> (
    None
):
    api = LoadingFence()
    loaded_when_leading: list[str] = []
    leader = replica(
        api,
        "a",
        wall=[1000.0],
        elapsed=[0.0],
        on_started=lambda: loaded_when_leading.append(api.loaded),
    )
    await leader.step()
    assert loaded_when_leading == ["0.uid-1"]  # its Bindings are taken from the first
