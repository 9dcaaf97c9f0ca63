"""Lease-based leader election: only the holder of the Lease binds pods.

Every replica watches and keeps its cache warm; the one holding the coordination.k8s.io
Lease also runs the decision loop and the status writer. A holder renews every
`retry_period_s`; it stops leading if it cannot renew within `renew_deadline_s`; a standby
takes over once `lease_duration_s` has passed since the last renewal (or at once when the
holder releases the Lease on a clean shutdown). kopf's peering is not used: it pauses
operators by priority and does not elect a leader. The holder keeps the configuration it
decides with on the Lease (`contract.EFFECTIVE_CONFIG`), so that the `gpushare` CLI decides
as it does.

Not `kubernetes_asyncio.leaderelection`: its elector never releases the Lease when its holder
stops (a rolling update would leave the cluster without a scheduler for a whole lease
duration), returns for good once it loses the Lease (a replica cut off for a moment would never
stand again), and does not say when the API last answered, which the liveness probe reads
(`last_contact`). What is here is one Lease read, create or replace per period.
"""

from __future__ import annotations

import asyncio
import enum
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpushare import logs
from gpushare.kube import ApiError
from gpushare.kube.clock import micro_time
from gpushare.model import contract
from gpushare_operator.config import OperatorConfig, lease_label, live_view
from gpushare_operator.kubeapi import Fenced, SchedulerApi, TermStamp

FENCE_WAIT_S = 5.0
"""How long a new term waits at most for the apiserver to hold it (its renewal also bounds it)."""
FENCE_POLL_S = 0.1
"""How often it asks meanwhile."""
FENCE_LOAD_S = 60.0
"""How long the apiserver may take to enforce a binding that holds a replica's term (about a
second after a change) before that replica takes it as not enforced at all."""
NO_TERM = "probe"
"""A term label no holder has (a term's is `<transitions>.<uid>`): what the fence refuses once in
force."""


@dataclass(frozen=True)
class LeaseTerm:
    """One holder's time on the Lease, as the writes sent in it name it. A new holder counts
    one more transition, and a Lease made anew has a new uid."""

    namespace: str
    name: str
    holder: str
    transitions: int
    uid: str

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> LeaseTerm:
        """The term of `lease` as the apiserver returned it (its uid included)."""
        meta, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            holder=spec.get("holderIdentity") or "",
            transitions=int(spec.get("leaseTransitions") or 0),
            uid=meta.get("uid", ""),
        )

    @property
    def label(self) -> str:
        """`contract.LEASE_TERM_LABEL`'s value, which the fence's binding compares."""
        return f"{self.transitions}.{self.uid}"

    @property
    def lease_label(self) -> str:
        """`contract.LEASE_LABEL`'s value, which the fence's binding selects."""
        return lease_label(self.namespace, self.name)

    def __str__(self) -> str:
        """`contract.LEADER_TERM`'s value, for people and logs."""
        return f"{self.namespace}/{self.name}/{self.holder}/{self.transitions}"

    def stamp(self) -> TermStamp:
        return TermStamp(
            annotations={contract.LEADER_TERM: str(self)},
            labels={contract.LEASE_LABEL: self.lease_label, contract.LEASE_TERM_LABEL: self.label},
        )

    def stamp_of_no_term(self) -> TermStamp:
        """A write of this Lease in a term no holder has: the fence in force refuses it."""
        return TermStamp(
            labels={contract.LEASE_LABEL: self.lease_label, contract.LEASE_TERM_LABEL: NO_TERM}
        )


class _Answer(enum.Enum):
    """What the apiserver answered the dry runs of a term's write and of one of no term."""

    HOLDS = "takes the term's writes, and refuses one of no term where that was asked"
    REFUSES = "refuses the term's writes"
    UNENFORCED = "takes the term's writes and one of no term alike"


class WriteFence:
    """What each write only the leader may send (a Binding, an eviction) asks first, in the
    scheduler, the defragmenter and the over-use guard alike. A replica paused past its Lease
    (SIGSTOP, a stalled VM) resumes sure it leads until its next round, while a standby may
    already lead: none of its writes is sent then. A pause after the last ask is caught by the
    apiserver: each such write names its Lease term (`stamp`), and the binding
    gpushare-leader-writes, which holds the term of the leader now, refuses it once the term
    is over."""

    def __init__(
        self, may_write: Callable[[], bool], term: Callable[[], LeaseTerm | None] = lambda: None
    ) -> None:
        """`may_write`: `LeaseElector.fresh`, or always true without leader election;
        `term`: `LeaseElector.term` (None without leader election)."""
        self._may_write = may_write
        self._term = term

    def stamp(self) -> TermStamp:
        """What names the term a write is sent in (nothing without a term)."""
        term = self._term()
        return term.stamp() if term else TermStamp()

    def check(self, write: str) -> None:
        """Return if `write` may be sent now, else raise Fenced saying why not."""
        if not self._may_write():
            raise Fenced(
                f"{write} not sent: this replica's Lease was not renewed within the renew "
                f"deadline (paused, or cut off from the apiserver); another may lead now"
            )


class LeaseElector:
    def __init__(
        self,
        api: SchedulerApi,
        *,
        config: Callable[[], OperatorConfig],
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        fence_wait_s: float = FENCE_WAIT_S,
    ) -> None:
        """`clock`: the wall clock, for the times written on the Lease. `monotonic`: this
        replica's own elapsed time, which alone decides whether a Lease has expired (as
        client-go's elector does): another replica's clock may run ahead or behind.
        `fence_wait_s`: how long a new term waits for the apiserver to hold it."""
        self._api = api
        self._config = config
        self._started = on_started_leading
        self._stopped = on_stopped_leading
        self._clock = clock
        self._monotonic = monotonic
        self._fence_wait_s = fence_wait_s
        self.leading = False
        self.decided = asyncio.Event()
        """Set once the first round has ended: whether this replica leads is known."""
        self.last_contact: float | None = None
        """When the API last answered a Lease call (for the liveness probe)."""
        self._led_in: LeaseTerm | None = None
        """The term this leadership began in."""
        self.term: LeaseTerm | None = None
        """The term of the Lease as this replica last wrote it: a new holder makes a new
        term."""
        self._fenced_in: LeaseTerm | None = None
        """The term this replica last set on the fence's binding and saw enforced, or leads
        in unfenced (no binding of its Lease, no right to it, or a binding not enforced)."""
        self._binding_holds = False
        """Whether each round also asks that a write of no term is refused: the binding held
        `_fenced_in` and the apiserver enforced it (not so in the unfenced cases above)."""
        self._unenforced: tuple[LeaseTerm, float] | None = None
        """The term, and since when (`monotonic`), whose every answer has been that the
        apiserver takes writes of no term as well while the binding holds the term: it does not
        enforce the binding (not yet, or not at all)."""
        self._renewed_at = 0.0
        self._observed: tuple[object, ...] | None = None
        """The Lease's holder record as last read, and (`_observed_at`) when, by
        `monotonic`, it last changed."""
        self._observed_at = 0.0
        start = config()
        self._log = logs.get(
            "election",
            lease=f"{start.lease_namespace}/{start.lease_name}",
            identity=start.identity,
        )

    async def run(self) -> None:
        while True:
            await self.step()
            self.decided.set()
            await asyncio.sleep(self._config().retry_period_s)

    def fresh(self) -> bool:
        """Leading, with the Lease renewed within the renew deadline (shorter than the Lease):
        no standby can have taken it yet. A replica paused past its Lease (SIGSTOP, a stalled
        VM) resumes sure it leads until its next round: `WriteFence` asks this first. And
        with its term held by the fence: a write the apiserver would refuse is not sent."""
        return self.leading and self._in_time() and self._fenced_in == self.term

    async def step(self) -> None:
        """One acquire-or-renew round, and the transitions it causes."""
        asked = self._monotonic()  # the renewal counts from when it was asked, not answered
        held = await self._acquire_or_renew()
        now = self._monotonic()
        if held:
            self._renewed_at = asked
            if self.leading and self.term != self._led_in:
                # Taken anew while it believed it led (paused while another held the Lease and
                # gave it up): what it decided before is of a term that is over. Lead afresh.
                self.leading = False
                self._log.warning("stopped_leading", reason=f"the Lease was {self._led_in}'s")
                self._stopped()
            if not await self._keep_fence():
                return  # not before the apiserver refuses the writes of the term before
            if not self.leading:
                self.leading = True
                self._led_in = self.term
                self._log.info("started_leading", term=str(self.term))
                self._started()
            return
        if self.leading and now - self._renewed_at > self._config().renew_deadline_s:
            self.leading = False
            self._log.warning("stopped_leading", reason="could not renew the Lease in time")
            self._stopped()

    def on_term_refused(self) -> None:
        """The apiserver refused a write as sent in a term that is over: if this replica still
        holds the Lease, the binding no longer holds its term (an admin applied the manifests
        again, or rolled them back): its next round sets it again."""
        self._fenced_in = None

    def _in_time(self) -> bool:
        """Whether the last renewal is recent enough that no other replica can hold the
        Lease: what this replica sets on the fence must never be a term that is over."""
        return self._monotonic() - self._renewed_at <= self._config().renew_deadline_s

    async def _keep_fence(self) -> bool:
        """Whether this replica may lead now: the apiserver refuses the writes of its Lease
        sent in any other term (or fences none of them, and this replica says so). Asked each
        round: an apply or a rollback may have set another term on the binding meanwhile."""
        term = self.term
        assert term is not None
        if self._fenced_in == term:
            try:
                answer = await self._ask_apiserver(term, by_binding=self._binding_holds)
                if answer is _Answer.HOLDS:
                    return True
            except (ApiError, OSError, TimeoutError) as error:
                self._log.warning("leader_fence_not_confirmed", error=repr(error))
                return True  # as it was last round; asked again next round
            self._log.warning("leader_fence_lost", term=term.label)
            self._fenced_in = None
        return await self._set_fence(term)

    async def _set_fence(self, term: LeaseTerm) -> bool:
        """Set `term` on the fence's binding, unless a later term of the Lease is there (this
        replica's renewal raced a takeover); whether this replica may lead."""
        try:
            requirements = await self._api.read_fence()
        except (ApiError, OSError, TimeoutError) as error:
            if isinstance(error, ApiError) and error.status == 403:
                return await self._lead_unset(term, error)
            self._log.warning("leader_fence_not_set", error=repr(error))
            return False
        before = _term_held(requirements, term.lease_label)
        if before is None:
            # No binding of this Lease in the manifests' shape: if the apiserver takes this
            # term's writes, nothing refuses those of a term that is over either. Lead all the
            # same, as without the policy; else wait for an admin to mend the binding.
            held = await self._held_in_time(term, by_binding=False)
            return held is _Answer.HOLDS and self._lead_unfenced(
                term,
                fix=f"apply this version's manifests or chart: the binding "
                f"{contract.FENCE_BINDING}, whose requirements select {contract.LEASE_LABEL} "
                f"in ({term.lease_label}) and {contract.LEASE_TERM_LABEL} not in (a term)",
            )
        if _later(before, term):
            self._log.warning("leader_fence_later", held=before, term=term.label)
            return False
        set_now = before == [term.label] or await self._patch_fence(term, before)
        return set_now and await self._enforced(term)

    async def _enforced(self, term: LeaseTerm) -> bool:
        """Whether this replica may lead with `term` set on the binding: the apiserver enforces
        it, or has not for longer than a binding takes to load (`FENCE_LOAD_S`: its policy
        deleted, then it leads unfenced rather than schedule nothing)."""
        answer = await self._held_in_time(term, by_binding=True)
        if answer is _Answer.HOLDS:
            self._fenced_in, self._binding_holds = term, True
            return True
        unenforced = self._unenforced  # this term's, as this round's last answer says
        if (
            answer is not _Answer.UNENFORCED  # in time, or None
            or unenforced is None
            or self._monotonic() - unenforced[1] < FENCE_LOAD_S
        ):
            return False
        return self._lead_unfenced(
            term,
            fix=f"apply this version's manifests or chart: the apiserver takes every write of "
            f"{contract.LEASE_LABEL}={term.lease_label} though the binding "
            f"{contract.FENCE_BINDING} holds term {term.label}; is its policy of that name "
            "there?",
        )

    def _lead_unfenced(self, term: LeaseTerm, *, fix: str) -> bool:
        """Lead in `term` with nothing refusing the writes of a term that is over, and say so."""
        self._log.warning("leader_writes_unfenced", term=term.label, fix=fix)
        self._fenced_in, self._binding_holds = term, False
        return True

    async def _patch_fence(self, term: LeaseTerm, before: list[str]) -> bool:
        """Replace `before` with `term` on the binding; whether it was."""
        if not self._in_time():
            return False
        try:
            await self._api.set_fence(term.lease_label, before, term.label)
        except ApiError as error:
            if error.status == 403:
                return await self._lead_unset(term, error)
            # 422: the binding changed since it was read; read it again next round.
            self._log.warning("leader_fence_not_set", error=str(error))
            return False
        except (OSError, TimeoutError) as error:
            self._log.warning("leader_fence_not_set", error=repr(error))
            return False
        return True

    async def _ask_apiserver(self, term: LeaseTerm, *, by_binding: bool) -> _Answer:
        """Whether the apiserver takes a write of `term`, and (`by_binding`: the binding holds
        `term`) refuses one of no term: the binding is in force there. Not yet so for a moment
        after the binding is made (a fresh install): the apiserver takes every write then, and
        once it loads the binding, refuses this term's until it loads the term set on it.
        Raises as `SchedulerApi.fence_holds`; `_unenforced` is kept only by an answer.
        The write of no term is asked first: the apiserver may load the binding between the two
        asks, and it loads forward only (not at all, then as created, then with the term set),
        so only this term's write taken after one of no term was refused shows the term held
        (asked the other way round, a fresh install's binding loaded as created in between
        passed for this term's: CI caught its first Bindings refused)."""
        unenforced, self._unenforced = self._unenforced, None
        no_term_taken = by_binding and await self._api.fence_holds(
            term.namespace, term.stamp_of_no_term()
        )
        if not await self._api.fence_holds(term.namespace, term.stamp()):
            return _Answer.REFUSES
        if not no_term_taken:
            return _Answer.HOLDS
        same_term = unenforced is not None and unenforced[0] == term
        self._unenforced = unenforced if same_term else (term, self._monotonic())
        return _Answer.UNENFORCED

    async def _held_in_time(self, term: LeaseTerm, *, by_binding: bool) -> _Answer | None:
        """HOLDS if the apiserver holds `term` (`_ask_apiserver`) before this round's renewal
        runs out; else its last answer (None: no answer, or too late). It rebuilds its
        policies a second after a change: until then it would take the writes of the term
        before, and refuse this one's."""
        # Within half the renew deadline, so that the round ends and the next renews in time.
        wait_s = min(self._fence_wait_s, self._config().renew_deadline_s / 2)
        started = self._monotonic()
        answer: _Answer | None = None
        for _ in range(max(1, round(wait_s / FENCE_POLL_S))):
            try:
                answer = await self._ask_apiserver(term, by_binding=by_binding)
            except (ApiError, OSError, TimeoutError) as error:
                self._log.warning("leader_fence_not_confirmed", error=repr(error))
                return None
            if (
                answer is _Answer.HOLDS
                or not self._in_time()
                or self._monotonic() - started >= wait_s
            ):
                break
            await asyncio.sleep(FENCE_POLL_S)
        if answer is not _Answer.HOLDS:
            self._log.warning(
                "leader_fence_not_confirmed",
                error=f"the apiserver did not hold term {term.label} in time: it "
                + (answer.value if answer is not None else "did not answer"),
            )
        return answer if self._in_time() else None

    async def _lead_unset(self, term: LeaseTerm, error: ApiError) -> bool:
        """No right to read or set the fence's binding (an operator upgraded before its
        ClusterRole): lead if the apiserver takes this term's writes all the same."""
        self._log.error(
            "leader_fence_not_set",
            error=str(error),
            fix="give the operator's ServiceAccount get and patch on the "
            f"ValidatingAdmissionPolicyBinding {contract.FENCE_BINDING} (the ClusterRole "
            "gpushare-operator of this version's manifests or chart)",
        )
        try:
            taken = await self._api.fence_holds(term.namespace, term.stamp()) and self._in_time()
        except (ApiError, OSError, TimeoutError):
            return False
        if taken:
            self._fenced_in, self._binding_holds = term, False  # then asked each round
        return taken

    async def release(self) -> None:
        """Give the Lease up now (clean shutdown), so a standby need not wait it out."""
        if self.leading:
            self.leading = False
            self._stopped()
        config = self._config()
        try:  # held or not as far as it knows: a renewal cut short may have landed
            lease = await self._read()
        except _Unreachable:
            return
        if lease is None or lease.get("spec", {}).get("holderIdentity") != config.identity:
            return
        lease["spec"]["holderIdentity"] = None
        lease["spec"]["leaseDurationSeconds"] = 1
        try:
            await self._api.write_lease(config.lease_namespace, lease, create=False)
        except ApiError as error:
            self._log.warning("release_failed", error=str(error))

    async def _read(self) -> dict[str, Any] | None:
        config = self._config()
        try:
            lease = await self._api.read_lease(config.lease_namespace, config.lease_name)
        except (ApiError, OSError, TimeoutError) as error:
            self._log.warning("lease_read_failed", error=repr(error))
            raise _Unreachable from error
        self.last_contact = self._clock()
        return lease

    async def _acquire_or_renew(self) -> bool:
        try:
            lease = await self._read()
        except _Unreachable:
            return False
        config = self._config()
        now = self._clock()
        stamp = micro_time(now)
        duration = max(1, round(config.lease_duration_s))
        try:
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": config.lease_name,
                        "namespace": config.lease_namespace,
                        "annotations": _published(config),
                    },
                    "spec": {
                        "holderIdentity": config.identity,
                        "leaseDurationSeconds": duration,
                        "acquireTime": stamp,
                        "renewTime": stamp,
                        "leaseTransitions": 0,
                    },
                }
                written = await self._api.write_lease(config.lease_namespace, body, create=True)
                self.term = LeaseTerm.of(written)
                return True
            spec = lease.setdefault("spec", {})
            holder = spec.get("holderIdentity")
            held_for = spec.get("leaseDurationSeconds") or duration
            if holder and holder != config.identity and not self._expired(lease, float(held_for)):
                return False  # someone else holds a live Lease
            if holder != config.identity:
                spec["acquireTime"] = stamp
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
            spec.update(
                holderIdentity=config.identity, renewTime=stamp, leaseDurationSeconds=duration
            )
            metadata = lease.setdefault("metadata", {})
            metadata["annotations"] = {**(metadata.get("annotations") or {}), **_published(config)}
            # resourceVersion in the body: a concurrent writer makes this a 409.
            written = await self._api.write_lease(config.lease_namespace, lease, create=False)
            self.term = LeaseTerm.of(written)
            return True
        except ApiError as error:
            if error.status == 404:
                self._log.error(
                    "lease_namespace_missing",
                    error=error.message,
                    fix=f"create namespace {config.lease_namespace} or set "
                    "GPUSHARE_LEASE_NAMESPACE",
                )
            elif error.status != 409:
                self._log.warning("lease_write_failed", error=str(error))
            return False
        except (OSError, TimeoutError) as error:
            self._log.warning("lease_write_failed", error=repr(error))
            return False

    def _expired(self, lease: dict[str, Any], duration_s: float) -> bool:
        """Whether another holder's Lease has gone unwritten for `duration_s` of this
        replica's own time: what the holder wrote is compared with nothing but its previous
        state (every write changes the resourceVersion), so clocks that disagree never hand
        over a live Lease."""
        spec = lease.get("spec") or {}
        version = (lease.get("metadata") or {}).get("resourceVersion")
        record = (version, spec.get("holderIdentity"), spec.get("renewTime"))
        now = self._monotonic()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        return now - self._observed_at > duration_s


def _term_held(requirements: list[dict[str, Any]] | None, lease: str) -> list[str] | None:
    """The term values of a fence binding of `lease` (its Lease, then its term, in the shape
    the manifests give it); None when the binding is missing or fences another Lease."""
    if requirements is None or len(requirements) != 2:
        return None
    first, second = requirements
    shaped = (
        first.get("key") == contract.LEASE_LABEL
        and first.get("operator") == "In"
        and first.get("values") == [lease]
        and second.get("key") == contract.LEASE_TERM_LABEL
        and second.get("operator") == "NotIn"
    )
    return list(second.get("values") or []) if shaped else None


def _later(held: list[str], term: LeaseTerm) -> bool:
    """Whether the binding holds a later term of the same Lease than `term`."""
    for value in held:
        transitions, _, uid = value.partition(".")
        if uid == term.uid and transitions.isdigit() and int(transitions) > term.transitions:
            return True
    return False


def _published(config: OperatorConfig) -> dict[str, str]:
    """The Lease's annotation saying how the holder decides (read by the `gpushare` CLI)."""
    return {contract.EFFECTIVE_CONFIG: json.dumps(live_view(config), sort_keys=True)}


class _Unreachable(Exception):
    """The Lease could not be read."""
