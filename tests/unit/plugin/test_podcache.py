"""The device plugin's record of what it served, kept true when the kubelet starts a pod with
the grant served under another pod's name (the call names device ids, not pods)."""

from __future__ import annotations

from typing import Any

from builders import gpu_pod

from gpushare.model import contract
from gpushare.model.bound import bound_pod
from gpushare.model.usage import PodUid
from gpushare_plugin.podcache import PodCache


class Api:
    def pod_lister(self, node: str) -> Any:
        return lambda **_: None


def pod(name: str, at: int, *, admitted: bool = False) -> Any:
    body = gpu_pod(name, 10, node="n", index="0", uid=name)
    body["metadata"]["annotations"][contract.PREDICATE_TIME] = str(at)
    if admitted:
        body["status"]["phase"] = "Running"
        body["status"]["containerStatuses"] = [{"name": "cuda-container"}]
    return bound_pod(body)


def cache_with(*pods: Any) -> PodCache:
    cache = PodCache(Api(), "n")  # type: ignore[arg-type]
    cache._listed(set(), "1")
    for each in pods:
        cache._apply("ADDED", each)
    return cache


def test_the_record_follows_a_grant_the_kubelet_gave_another_pod() -> None:
    cache = cache_with(pod("first", 1), pod("second", 2))
    cache.served[PodUid("second")] = 1  # served "second" for the call the kubelet made for "first"
    cache._apply("MODIFIED", pod("first", 1, admitted=True))
    assert cache.served == {"first": 1}
    assert cache.reopened == {"second"}
    # Only a pod seen started is marked gpu-assigned: meanwhile the operator keeps pods of
    # the request of "second" on its card.
    assert cache.to_mark.get_nowait().ref.name == "first"
    assert cache.to_mark.empty()
    # "second" admitted in turn (with a grant served meanwhile under another name): done.
    cache._apply("MODIFIED", pod("second", 2, admitted=True))
    assert cache.reopened == set()
    assert cache.served == {"first": 1, "second": 1}
    assert cache.to_mark.get_nowait().ref.name == "second"


def test_a_pod_of_the_first_list_is_never_taken_for_a_swap() -> None:
    # Bound before this plugin started: another instance of it may have served it.
    cache = PodCache(Api(), "n")  # type: ignore[arg-type]
    cache._apply("ADDED", pod("old", 1))
    cache._listed({"old"}, "1")
    cache._apply("ADDED", pod("new", 2))
    cache.served[PodUid("new")] = 1
    cache._apply("MODIFIED", pod("old", 1, admitted=True))
    assert cache.served == {"new": 1}
    assert cache.reopened == set()
