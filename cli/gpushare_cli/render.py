"""The CLI's reports as people read them (tables) and as programs do (`-o json`)."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

from gpushare.model import GpuKind, Placement, contract
from gpushare.model.defrag import DefragPlan
from gpushare.model.diagnosis import CardProblem, NodeVerdict, format_amount
from gpushare_cli.report import (
    Bound,
    CardReport,
    Explanation,
    NodeReport,
    Placeable,
    PodOnCard,
)

# -- inspect ---------------------------------------------------------------------------------


def inspect_json(report: Sequence[NodeReport]) -> list[dict[str, Any]]:
    return [
        {
            "node": node.node,
            "source": node.source.value,
            "unitMiB": node.unit_mib,
            "usedMiB": node.used_mib,
            "totalMiB": node.total_mib,
            "cards": [
                {
                    "index": card.index,
                    "model": card.model,
                    "uuid": card.uuid,
                    "health": _health(card),
                    "usedMiB": card.used_mib,
                    "totalMiB": card.total_mib,
                    "measuredMiB": card.measured_mib,
                    "pods": [
                        {
                            "namespace": pod.namespace,
                            "name": pod.name,
                            "mib": pod.mib,
                            "measuredMiB": pod.measured_mib,
                        }
                        for pod in card.pods
                    ],
                }
                for card in node.cards
            ],
        }
        for node in report
    ]


def render_inspect(report: Sequence[NodeReport], detail: bool) -> str:
    if not report:
        return "no GPU nodes"
    if detail:
        rows = [("NODE", "CARD", "MODEL", "USED/TOTAL MiB", "MEASURED MiB", "HEALTH", "PODS")]
        for node in report:
            for i, card in enumerate(node.cards):
                rows.append(
                    (
                        node.node if i == 0 else "",
                        str(card.index),
                        card.model,
                        f"{card.used_mib}/{card.total_mib}",
                        "-" if card.measured_mib is None else str(card.measured_mib),
                        _health(card),
                        ", ".join(_pod_on_card(p) for p in card.pods) or "-",
                    )
                )
            rows.append(("", "total", "", f"{node.used_mib}/{node.total_mib}", "", "", ""))
        return table(rows)
    most = max(len(node.cards) for node in report)
    head = ("NODE", *(f"GPU{i}(Used/Total)" for i in range(most)), "GPU MEMORY MiB")
    lines: list[tuple[str, ...]] = [head]
    for node in report:
        cells = [
            f"{card.used_mib}/{card.total_mib}" + ("" if card.healthy else "!")
            for card in node.cards
        ]
        cells += [""] * (most - len(cells))
        lines.append((node.node, *cells, f"{node.used_mib}/{node.total_mib}"))
    used = sum(node.used_mib for node in report)
    total = sum(node.total_mib for node in report)
    share = f"{round(100 * used / total)}%" if total else "0%"
    return (
        table(lines)
        + f"\nallocated/total GPU memory in the cluster: {used}/{total} MiB ({share})"
        + (
            "\n(! marks an unhealthy card)"
            if any(not card.healthy for node in report for card in node.cards)
            else ""
        )
    )


def _pod_on_card(pod: PodOnCard) -> str:
    """`ns/name 1024 MiB`, and what it holds there when measured: `(uses 3000, over)`."""
    shown = f"{pod.namespace}/{pod.name} {pod.mib} MiB"
    if pod.measured_mib is None:
        return shown
    over = ", over" if pod.measured_mib > pod.mib else ""
    return f"{shown} (uses {pod.measured_mib}{over})"


def _health(card: CardReport) -> str:
    return contract.HEALTHY if card.healthy else contract.UNHEALTHY


# -- explain and simulate --------------------------------------------------------------------


def enum_name(value: Enum) -> str:
    """An enum as `-o json` shows it: a CamelCase identifier (TOO_LITTLE_MEMORY:
    TooLittleMemory), stable for programs, where tables show the sentence."""
    return "".join(part.capitalize() for part in value.name.split("_"))


def explain_json(report: Explanation) -> dict[str, Any]:
    shown: dict[str, Any] = {"pod": report.pod, "schedulerName": report.scheduler_name}
    if report.group is not None:
        shown["group"] = report.group
    outcome = report.outcome
    if isinstance(outcome, Bound):
        shown.update(
            state=enum_name(outcome.state),
            node=outcome.node,
            card=outcome.card,
            assigned=outcome.assigned,
            phase=outcome.phase,
        )
        return shown
    if report.note is not None:
        shown["note"] = report.note
    if report.pod_scheduled is not None:
        shown["schedulerSays"] = report.pod_scheduled.get("message")
    shown.update(
        policy=outcome.policy.value, state=enum_name(outcome.state), operator=report.leader
    )
    if isinstance(outcome, Placeable):
        shown["node"] = outcome.node
        if outcome.placement is not None:
            shown["cards"] = list(outcome.placement.cards)
            shown["freeLeft"] = free_left(outcome.placement)
        return shown
    shown["reason"] = outcome.reason
    if (preemption := outcome.preemption) is not None:
        shown["preempts"] = {
            "node": preemption.placement.node,
            "cards": list(preemption.placement.cards),
            "victims": [str(ref) for ref in preemption.victims],
        }
    shown["nodes"] = [_verdict_json(verdict) for verdict in outcome.nodes]
    return shown


def _verdict_json(verdict: NodeVerdict) -> dict[str, Any]:
    shown: dict[str, Any] = {"node": verdict.node, "problem": enum_name(verdict.problem)}
    if verdict.detail:
        shown["detail"] = verdict.detail
    cards = []
    for card in verdict.cards:
        entry: dict[str, Any] = {"index": card.card, "problem": enum_name(card.problem)}
        if card.problem is CardProblem.TOO_LITTLE_MEMORY:
            entry.update(freeMiB=card.free * card.unit_mib, neededMiB=card.need * card.unit_mib)
        if card.detail:
            entry["detail"] = card.detail
        cards.append(entry)
    shown["cards"] = cards
    return shown


def render_explain(report: Explanation) -> str:
    lines = [f"pod {report.pod} (schedulerName {report.scheduler_name})"]
    if report.group:
        lines.append(f"group: {report.group}")
    if report.note:
        lines.append(f"note: {report.note}")
    outcome = report.outcome
    if isinstance(outcome, Bound):
        assigned = "served by the device plugin" if outcome.assigned else "not yet started"
        lines.append(
            f"bound to {outcome.node}, card {outcome.card or '-'}; {assigned}; "
            f"phase {outcome.phase}"
        )
        return "\n".join(lines)
    if report.pod_scheduled is not None and (says := report.pod_scheduled.get("message")):
        lines.append(f"the scheduler says: {says}")
    if report.leader is None:
        lines.append(
            "note: no gpushare operator leads now (its Lease is not held): decided with this "
            "shell's GPUSHARE_* environment and the live GPUShareConfig"
        )
    else:
        lines.append(f"decided as the operator {report.leader} decides")
    if isinstance(outcome, Placeable):
        where: str = outcome.node
        if (placement := outcome.placement) is not None:
            cards = ",".join(map(str, placement.cards))
            where += f" card {cards} ({free_left(placement)} left)"
        lines.append(f"{outcome.state.value} ({outcome.policy.value}): {where}")
        return "\n".join(lines)
    lines.append(f"{outcome.state.value}: {outcome.reason}")
    if (preemption := outcome.preemption) is not None:
        cards = ",".join(map(str, preemption.placement.cards))
        victims = ", ".join(map(str, preemption.victims))
        lines.append(f"would evict, on {preemption.placement.node} card {cards}: {victims}")
    if outcome.nodes:
        rows = [("NODE", "WHY NOT", "CARDS")]
        rows += [
            (verdict.node, verdict.label, "; ".join(map(str, verdict.cards)) or "-")
            for verdict in outcome.nodes
        ]
        lines.append(table(rows))
    return "\n".join(lines)


def free_left(placement: Placement) -> str:
    """What the placement leaves free: memory on its card, or idle cards on its node."""
    if placement.kind is GpuKind.MEMORY:
        return format_amount(placement.free_after, placement.unit_mib)
    return f"{placement.free_after} idle cards"


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def defrag_json(plan: DefragPlan) -> dict[str, Any]:
    return {
        "rooms": [
            {
                "pod": str(room.pod),
                "node": room.placement.node,
                "card": room.placement.cards[0],
                "freeBeforeMiB": room.free_before_mib,
                "freedMiB": room.freed_mib,
                "moves": [
                    {
                        "pod": str(move.pod),
                        "mib": move.mib,
                        "from": {"node": move.node, "card": move.card},
                        "to": {"node": move.to.node, "card": move.to.cards[0]},
                    }
                    for move in room.moves
                ],
            }
            for room in plan.rooms
        ],
        "waiting": [{"pod": str(pod), "reason": reason} for pod, reason in plan.waiting],
    }


def render_defrag(plan: DefragPlan) -> str:
    if not plan.rooms and not plan.waiting:
        return "no pod waits for a GPU: nothing to move"
    moves = plan.moves
    lines = [
        f"{len(moves)} move(s) for {sum(1 for r in plan.rooms if r.moves)} waiting pod(s); "
        f"each moved pod is evicted and its controller's replacement placed again"
    ]
    for room in plan.rooms:
        mib = room.placement.amount * room.placement.unit_mib
        where = f"{room.placement.node} card {room.placement.cards[0]}"
        if not room.moves:
            lines.append(f"{room.pod} ({mib} MiB): fits now on {where}")
            continue
        lines.append(
            f"{room.pod} ({mib} MiB): {where}, {room.free_before_mib} MiB free now, "
            f"{room.freed_mib} MiB once these move:"
        )
        lines += [
            f"  move {move.pod} ({move.mib} MiB) from {move.node} card {move.card} to "
            f"{move.to.node} card {move.to.cards[0]}"
            for move in room.moves
        ]
    lines += [f"still waiting: {pod}: {reason}" for pod, reason in plan.waiting]
    return "\n".join(lines)
