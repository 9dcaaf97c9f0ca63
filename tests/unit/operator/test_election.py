"""Leader election judged by each replica's own elapsed time, never by another's clock."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest

from gpushare.model import contract
from gpushare_operator.config import OperatorConfig
from gpushare_operator.election import LeaseElector, WriteFence

pytestmark = pytest.mark.asyncio

LEASE = "gpushare-system/gpushare-scheduler"  # the default Lease, its namespace and name


class OneLease:
    """The Lease as the apiserver keeps it: a read, a create, a replace."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.lease)

    async def write_lease(self, namespace: str, body: Mapping[str, Any], *, create: bool) -> None:
        self.lease = copy.deepcopy(dict(body))
        self.version += 1
        self.lease["metadata"]["resourceVersion"] = str(self.version)


def replica(api: OneLease, identity: str, wall: list[float], elapsed: list[float]) -> LeaseElector:
    config = OperatorConfig(identity=identity, lease_duration_s=15, renew_deadline_s=10)
    return LeaseElector(
        api,  # type: ignore[arg-type]  # the two Lease calls are all it makes
        config=lambda: config,
        on_started_leading=lambda: None,
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
    assert fence.stamp() == {contract.LEADER_TERM: f"{LEASE}/a/0"}
    await b.step()
    b_elapsed[0] += 16  # "a" paused past its Lease: "b" takes it, in a term of its own
    await b.step()
    assert b.term == f"{LEASE}/b/1"
    assert api.lease is not None
    assert api.lease["spec"]["leaseTransitions"] == 1
    # Resumed, "a" stamps its writes with the term that is over: the apiserver's policy
    # (gpushare-leader-writes) compares it with the Lease's and refuses them.
    assert fence.stamp() == {contract.LEADER_TERM: f"{LEASE}/a/0"}
    await a.step()  # "a" steps down and sees "b" hold the Lease
    a_elapsed[0] += 16  # "b" gone quiet in turn: "a" leads again, in a new term
    await a.step()
    assert a.leading
    assert fence.stamp() == {contract.LEADER_TERM: f"{LEASE}/a/2"}
    assert not WriteFence(lambda: True).stamp()  # no leader election: nothing to stamp


async def test_a_lease_given_up_on_shutdown_is_taken_in_a_new_term() -> None:
    api = OneLease()
    a = replica(api, "a", wall=[1000.0], elapsed=[0.0])
    b = replica(api, "b", wall=[1000.0], elapsed=[0.0])
    await a.step()
    await a.release()  # a clean shutdown: no holder, at once
    await b.step()
    assert b.leading
    assert b.term == f"{LEASE}/b/1"
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
    # (the runtime cancels them and lists everything before deciding).
    assert transitions == ["started", "stopped", "started"]
    assert a.term == f"{LEASE}/a/2"
