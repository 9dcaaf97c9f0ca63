"""PodDisruptionBudgets as preemption and defragmentation read them: which pods a budget
covers and how many of them may go now.

An eviction through the Eviction API is refused (429) when it would take a budget's pods
below what the budget keeps; the apiserver's disruption controller publishes how many may go
as `status.disruptionsAllowed`. A set of evictions that takes more of a budget's pods than
that would be refused part-way: defragmentation never chooses such a set; preemption does
only when no other set makes room (kube-scheduler's rule), and deletes the pods of the
budgets it breaks instead of evicting them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpushare.model.bodies import Body, mapping, path, sequence, text
from gpushare.model.filters import requirement_matches

_SELECTOR_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist"})


@dataclass(frozen=True, kw_only=True, slots=True)
class Budget:
    """One PodDisruptionBudget."""

    namespace: str
    name: str
    match_labels: Mapping[str, str] | None
    """None: the budget selects no pod (a null selector, or one that cannot be read)."""
    match_expressions: tuple[Body, ...] = ()
    allowed: int = 0
    """`status.disruptionsAllowed`: how many of its pods may be evicted now."""

    def covers(self, namespace: str, labels: Mapping[str, str]) -> bool:
        if namespace != self.namespace or self.match_labels is None:
            return False
        if any(labels.get(key) != value for key, value in self.match_labels.items()):
            return False
        return all(requirement_matches(e, labels) for e in self.match_expressions)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def budget_of(body: Body) -> Budget:
    """A PodDisruptionBudget (policy/v1) as preemption reads it. An empty selector covers
    every pod of its namespace (policy/v1's rule); a missing one, or one with an operator
    that a label selector does not have, covers none; `disruptionsAllowed` missing (the
    disruption controller has not counted yet) allows none."""
    meta = path(body, "metadata")
    selector = path(body, "spec").get("selector")
    labels: dict[str, str] | None = None
    expressions: tuple[Body, ...] = ()
    if isinstance(selector, dict):
        raw_labels = mapping(selector.get("matchLabels"))
        raw_expressions = tuple(sequence(selector.get("matchExpressions")))
        if all(e.get("operator") in _SELECTOR_OPERATORS for e in raw_expressions):
            labels = {str(k): str(v) for k, v in raw_labels.items()}
            expressions = raw_expressions
    allowed = path(body, "status").get("disruptionsAllowed")
    return Budget(
        namespace=text(meta.get("namespace")) or "",
        name=text(meta.get("name")) or "",
        match_labels=labels,
        match_expressions=expressions,
        allowed=allowed if isinstance(allowed, int) and allowed > 0 else 0,
    )


@dataclass(frozen=True, slots=True)
class Breach:
    """What taking a set of pods does to the budgets."""

    over: int
    """Disruptions beyond what the budgets allow, summed over the budgets breached."""
    budgets: tuple[Budget, ...]
    """The budgets breached, in the order given."""
    pods: frozenset[int]
    """The positions (in the set as given) of the pods that a breached budget covers."""


def breach(budgets: Iterable[Budget], evicted: Iterable[tuple[str, Mapping[str, str]]]) -> Breach:
    """What evicting all of `evicted` ((namespace, labels) per pod) would breach."""
    pods = list(evicted)
    over = 0
    breached: list[Budget] = []
    covered: set[int] = set()
    for budget in budgets:
        mine = [i for i, (namespace, labels) in enumerate(pods) if budget.covers(namespace, labels)]
        if len(mine) > budget.allowed:
            over += len(mine) - budget.allowed
            breached.append(budget)
            covered.update(mine)
    return Breach(over=over, budgets=tuple(breached), pods=frozenset(covered))
