"""`gpushare defrag --apply` against a scripted apiserver: each move evicts one pod through
the Eviction API (its UID as a precondition) and waits for its controller's replacement to be
bound; a refusal stops the run at that move, saying why, with the moves before it kept."""

from __future__ import annotations

import json
from typing import Any

import pytest
from scripted import Apiserver, listing

from gpushare.model.annotations import CardIndex
from gpushare.model.defrag import Move
from gpushare.model.inventory import NodeName
from gpushare.model.placement import Placement
from gpushare.model.request import GpuKind
from gpushare.model.usage import PodRef, PodUid
from gpushare_cli.act import apply_moves
from gpushare_cli.errors import CliError
from gpushare_cli.kubeconfig import Source

PODS = "/api/v1/namespaces/team-a/pods"


def pod(name: str, *, controller: str | None = "rs-1", node: str | None = "n1") -> dict[str, Any]:
    owners = [{"kind": "ReplicaSet", "name": "r", "uid": controller, "controller": True}]
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "ownerReferences": owners if controller else [],
        },
        "spec": {"nodeName": node} if node else {},
    }


def move(name: str) -> Move:
    to = Placement(
        node=NodeName("n2"), cards=(CardIndex(0),), kind=GpuKind.MEMORY, amount=2, free_after=0
    )
    ref = PodRef(namespace="team-a", name=name, uid=PodUid(f"uid-{name}"))
    return Move(pod=ref, node=NodeName("n1"), card=CardIndex(1), units=2, unit_mib=512, to=to)


def eviction_answer(status: int, message: str = "") -> tuple[int, Any]:
    if status == 201:
        return 201, {"kind": "Status", "status": "Success", "code": 201}
    return status, {"kind": "Status", "status": "Failure", "code": status, "message": message}


@pytest.mark.asyncio
async def test_a_budget_s_refusal_stops_the_run_at_that_move_and_keeps_the_ones_before(
    apiserver: Apiserver, source: Source
) -> None:
    a, b = pod("a"), pod("b", controller="rs-2")
    a_again = pod("a-2", node="n2")
    apiserver[PODS] = [listing(a, b), listing(b, a_again), listing(b, a_again)]
    apiserver[f"{PODS}/a/eviction"] = eviction_answer(201)
    apiserver[f"{PODS}/b/eviction"] = eviction_answer(429, "would violate the disruption budget")
    said: list[str] = []

    with pytest.raises(CliError) as stopped:
        await apply_moves(source, [move("a"), move("b")], [a, b], said.append)

    assert said == [
        "move 1/2: evicted team-a/a from n1 card 1",
        "  its replacement team-a/a-2 is bound",
    ]
    assert str(stopped.value) == (
        "move 2: evicting team-a/b was refused (429: a PodDisruptionBudget forbids it now); "
        "the moves before it stand: run `gpushare defrag` again for a new plan"
    )
    evictions = [c for c in apiserver.calls if c.endswith("/eviction")]
    assert evictions == [f"POST {PODS}/a/eviction", f"POST {PODS}/b/eviction"]


@pytest.mark.asyncio
async def test_an_eviction_names_the_pod_s_uid_so_a_pod_replaced_meanwhile_is_not_touched(
    apiserver: Apiserver, source: Source, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = pod("a")
    apiserver[PODS] = [listing(a), listing(pod("a-2", node="n2"))]
    apiserver[f"{PODS}/a/eviction"] = eviction_answer(201)
    sent: list[Any] = []
    answer = apiserver.request

    async def request(method: str, url: str, **kwargs: Any) -> Any:
        if url.endswith("/eviction"):
            sent.append(kwargs.get("body"))
        return await answer(method, url, **kwargs)

    monkeypatch.setattr(apiserver, "request", request)
    await apply_moves(source, [move("a")], [a], lambda _: None)
    body = sent[0] if isinstance(sent[0], dict) else json.loads(sent[0])
    assert body["deleteOptions"]["preconditions"] == {"uid": "uid-a"}


@pytest.mark.asyncio
async def test_a_pod_already_gone_counts_as_evicted_and_its_replacement_is_waited_for(
    apiserver: Apiserver, source: Source
) -> None:
    a = pod("a")
    apiserver[PODS] = [listing(a), listing(pod("a-2", node=None)), listing(pod("a-2", node="n2"))]
    apiserver[f"{PODS}/a/eviction"] = eviction_answer(404, 'pods "a" not found')
    said: list[str] = []

    await apply_moves(source, [move("a")], [a], said.append)

    assert said[-1] == "  its replacement team-a/a-2 is bound"


@pytest.mark.asyncio
async def test_a_pod_without_a_controller_is_never_evicted(
    apiserver: Apiserver, source: Source
) -> None:
    bare = pod("bare", controller=None)
    apiserver[PODS] = listing(bare)

    with pytest.raises(CliError, match="pod team-a/bare has no controller to replace it"):
        await apply_moves(source, [move("bare")], [bare], lambda _: None)

    assert not [c for c in apiserver.calls if c.startswith("POST")]
