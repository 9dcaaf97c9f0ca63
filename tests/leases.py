"""The Lease as the apiserver keeps it and the leader fence's binding, for the operator's unit
tests (the elector's own, and the runtime's that lead)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from gpushare.kube import ApiError
from gpushare.model import contract
from gpushare_operator.election import NO_TERM
from gpushare_operator.kubeapi import TermStamp

LEASE_LABEL = "gpushare-system.gpushare-scheduler"  # the default Lease, as writes name it


class OneLease:
    """The Lease as the apiserver keeps it (a read, a create, a replace), and the fence's
    binding: the term it holds, the error that reading or setting it meets, and how many more
    times the apiserver answers from the term before (it rebuilds its policies a moment
    after a change), or as if there were no binding (not yet loaded after a fresh install)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.fence: tuple[str, str] | None = (LEASE_LABEL, "none")  # as the manifests have it
        self.fence_error: ApiError | None = None
        self.fence_writes = 0
        self.fence_lag = 0
        self.fence_unloaded = 0
        self.patch_error: ApiError | None = None
        self.probe_says: bool | None = None
        """Whether the apiserver takes the writes of a term, whatever the binding holds (a
        write of no term it refuses all the same)."""
        self.per_probe: Callable[[], None] = lambda: None
        self.meanwhile: Callable[[], None] = lambda: None
        """What happens between a replica's renewal and its read of the fence."""

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.lease)

    async def write_lease(
        self, namespace: str, body: Mapping[str, Any], *, create: bool
    ) -> dict[str, Any]:
        self.lease = copy.deepcopy(dict(body))
        self.version += 1
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        if create:
            self.lease["metadata"]["uid"] = "uid-1"
        return copy.deepcopy(self.lease)

    async def read_fence(self) -> list[dict[str, Any]] | None:
        self.meanwhile()
        if self.fence_error is not None:
            raise self.fence_error
        if self.fence is None:
            return None
        lease, term = self.fence
        return [
            {"key": contract.LEASE_LABEL, "operator": "In", "values": [lease]},
            {"key": contract.LEASE_TERM_LABEL, "operator": "NotIn", "values": [term]},
        ]

    async def set_fence(self, lease: str, before: list[str], term: str) -> None:
        self.fence_writes += 1
        if self.patch_error is not None:
            raise self.patch_error
        if self.fence is None or (lease, before) != (self.fence[0], [self.fence[1]]):
            raise ApiError(422, "the test operation failed")
        self.fence = (lease, term)

    async def fence_holds(self, namespace: str, stamp: TermStamp) -> bool:
        self.per_probe()
        term = stamp.labels[contract.LEASE_TERM_LABEL]
        if self.probe_says is not None:
            return self.probe_says and term != NO_TERM
        if self.fence_lag:
            self.fence_lag -= 1
            return False
        if self.fence_unloaded:
            self.fence_unloaded -= 1
            return True
        if self.fence is None or self.fence[0] != stamp.labels[contract.LEASE_LABEL]:
            return True  # nothing fences the Lease's writes
        return term == self.fence[1]
