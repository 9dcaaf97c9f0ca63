"""The CLI's reports as people read them (tables; `-o wide` adds columns and per-card rows)
and as programs do (`-o json`, and `-o yaml`: the same document)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from enum import Enum
from itertools import groupby
from typing import Any

import yaml

from gpushare.model import GpuKind, Placement, contract
from gpushare.model.defrag import DefragPlan
from gpushare.model.device_list import DeviceListStrategy
from gpushare.model.diagnosis import (
    CardProblem,
    CardVerdict,
    NodeProblem,
    NodeVerdict,
    format_amount,
)
from gpushare_cli.report import (
    Bound,
    CardReport,
    Explanation,
    NodeReport,
    Placeable,
    PodOnCard,
    Unplaceable,
)

DOCUMENTS = ("json", "yaml")
"""The outputs that print the report as a document, for programs."""


def document(shown: Any, output: str) -> str:
    """`shown` as JSON or as YAML (the same document: keys in the same order)."""
    if output == "yaml":
        return yaml.safe_dump(shown, sort_keys=False, allow_unicode=True).rstrip("\n")
    return json.dumps(shown, indent=2)


# -- inspect ---------------------------------------------------------------------------------


def inspect_json(report: Sequence[NodeReport]) -> list[dict[str, Any]]:
    return [
        {
            "node": node.node,
            "source": node.source.value,
            "unitMiB": node.unit_mib,
            "usedMiB": node.used_mib,
            "totalMiB": node.total_mib,
            "measuredAt": node.measured_at,
            "deviceListStrategy": node.strategy,
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
                            "grantedMiB": pod.granted_mib,
                            "over": pod.over,
                        }
                        for pod in card.pods
                    ],
                }
                | _others_json(card)
                for card in node.cards
            ],
        }
        for node in report
    ]


def _others_json(card: CardReport) -> dict[str, Any]:
    """What pods this user may not see hold on the card (only when some do)."""
    if not card.others_mib:
        return {}
    return {"otherNamespacesMiB": card.others_mib, "otherNamespacesPods": list(card.others)}


def render_inspect(report: Sequence[NodeReport], detail: bool, wide: bool = False) -> str:
    if not report:
        return "no GPU nodes"
    if wide:
        return _inspect_wide(report, detail)
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
                        _measured(card),
                        _health(card),
                        _pods_on_card(card),
                    )
                )
            measured = f"at {node.measured_at}" if node.measured_at else ""
            rows.append(("", "total", "", f"{node.used_mib}/{node.total_mib}", measured, "", ""))
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
    return table(lines) + _cluster_total(report)


def _inspect_wide(report: Sequence[NodeReport], detail: bool) -> str:
    """One row per card with its UUID, model, health and pod count (-d: the pods too)."""
    head = ("NODE", "CARD", "MODEL", "UUID", "HEALTH", "USED/TOTAL MiB", "MEASURED MiB", "PODS")
    rows: list[tuple[str, ...]] = [(*head, "POD LIST") if detail else head]
    for node in report:
        for i, card in enumerate(node.cards):
            row = (
                node.node if i == 0 else "",
                str(card.index),
                card.model,
                card.uuid or "-",
                _health(card),
                f"{card.used_mib}/{card.total_mib}",
                _measured(card),
                str(card.pod_count),
            )
            rows.append((*row, _pods_on_card(card)) if detail else row)
        total = ("", "total", "", "", "", f"{node.used_mib}/{node.total_mib}", "", "")
        rows.append((*total, "") if detail else total)
    return table(rows) + _cluster_total(report, marks=False) + _told_by_env(report)


def _told_by_env(report: Sequence[NodeReport]) -> str:
    """The nodes whose device plugin names cards by NVIDIA_VISIBLE_DEVICES alone, where what an
    image or envFrom sets can name others (the admin's to close)."""
    nodes = [node.node for node in report if node.strategy == DeviceListStrategy.ENVVAR]
    if not nodes:
        return ""
    return (
        f"\ncards named by NVIDIA_VISIBLE_DEVICES alone (envvar) on {', '.join(nodes)}: a "
        "container whose image or envFrom sets it can see every card there unless the NVIDIA "
        "container toolkit refuses it (docs/admission.md, what admission cannot see)"
    )


def _cluster_total(report: Sequence[NodeReport], *, marks: bool = True) -> str:
    used = sum(node.used_mib for node in report)
    total = sum(node.total_mib for node in report)
    share = f"{round(100 * used / total)}%" if total else "0%"
    return f"\nallocated/total GPU memory in the cluster: {used}/{total} MiB ({share})" + (
        "\n(! marks an unhealthy card)"
        if marks and any(not card.healthy for node in report for card in node.cards)
        else ""
    )


def _measured(card: CardReport) -> str:
    return "-" if card.measured_mib is None else str(card.measured_mib)


def _pods_on_card(card: CardReport) -> str:
    shown = [_pod_on_card(p) for p in card.pods]
    if card.others_mib:
        shown.append(f"other namespaces' pods {card.others_mib} MiB")
    return ", ".join(shown) or "-"


def _pod_on_card(pod: PodOnCard) -> str:
    """`ns/name 1024 MiB`, and what it holds there when measured: `(uses 3000, over)`, with
    what it was granted where that is not what it holds the devices of: `(uses 1010 of 1000
    granted, over)`."""
    shown = f"{pod.namespace}/{pod.name} {pod.mib} MiB"
    if pod.measured_mib is None:
        return shown
    granted = (
        f" of {pod.granted_mib} granted"
        if pod.granted_mib is not None and pod.granted_mib != pod.mib
        else ""
    )
    over = ", over" if pod.over else ""
    return f"{shown} (uses {pod.measured_mib}{granted}{over})"


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
            "pastBudgets": [str(ref) for ref in preemption.past_budgets],
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


def render_explain(report: Explanation, wide: bool = False) -> str:
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
        if wide:
            lines += _card_lines(report.node_reports.get(outcome.node), outcome.card)
        return "\n".join(lines)
    if report.pod_scheduled is not None and (says := report.pod_scheduled.get("message")):
        if isinstance(outcome, Unplaceable) and outcome.nodes:  # the table gives the detail
            says = _headline(str(says), outcome.nodes)
        lines.append(f"the scheduler says: {says}")
    if report.leader is not None:
        lines.append(f"decided as the operator {report.leader} decides")
    elif report.leader_known:
        lines.append(
            "note: no gpushare operator leads now (its Lease is not held): decided with this "
            "shell's GPUSHARE_* environment and the live GPUShareConfig"
        )
    if isinstance(outcome, Placeable):
        where: str = outcome.node
        if (placement := outcome.placement) is not None:
            cards = ",".join(map(str, placement.cards))
            where += f" card {cards} ({free_left(placement)} left)"
        lines.append(f"{outcome.state.value} ({outcome.policy.value}): {where}")
        if wide and outcome.placement is not None:
            chosen = ",".join(map(str, outcome.placement.cards))
            lines += _card_lines(report.node_reports.get(outcome.node), chosen)
        return "\n".join(lines)
    return "\n".join(lines + _unplaceable(report, outcome, wide))


def _unplaceable(report: Explanation, outcome: Unplaceable, wide: bool) -> list[str]:
    reason = _headline(outcome.reason, outcome.nodes) if outcome.nodes else outcome.reason
    lines = [f"{outcome.state.value}: {reason}"]
    if (preemption := outcome.preemption) is not None:
        where = f"on {preemption.placement.node} card "
        where += ",".join(map(str, preemption.placement.cards))
        evicted = [ref for ref in preemption.victims if ref not in preemption.past_budgets]
        if evicted:
            lines.append(f"would evict, {where}: {', '.join(map(str, evicted))}")
        if preemption.past_budgets:
            budgets = ", ".join(map(str, preemption.budgets))
            past = ", ".join(map(str, preemption.past_budgets))
            lines.append(f"would delete past PodDisruptionBudget {budgets}, {where}: {past}")
    if outcome.nodes:
        if (asked := _asked(outcome.nodes)) is not None:
            lines.append(f"it asks for {asked} on one card")
        lines.append(_verdicts_wide(report, outcome) if wide else _verdicts_table(outcome.nodes))
    return lines


SUMMARY_HEAD = " nodes are available: "


def _headline(reason: str, verdicts: Sequence[NodeVerdict]) -> str:
    """The scheduler's summary ("0/3 nodes are available: 2 no card with enough free GPU
    memory, 1 node(s) were not ready. gpu-1: card 0 ...; gpu-2: ...") without its node by
    node detail, which the table below gives; what follows that detail (preemption's
    verdict) is kept. Any other reason whole."""
    if not reason.startswith("0/") or SUMMARY_HEAD not in reason:
        return reason
    end = reason.find(". ", reason.index(SUMMARY_HEAD))
    if end < 0:
        return reason
    nodes = tuple(f"{verdict.node}: " for verdict in verdicts)
    kept = [
        piece
        for piece in reason[end + 2 :].split("; ")
        if not piece.startswith(nodes) and not MORE_NODES.fullmatch(piece)
    ]
    return " ".join([reason[: end + 1], "; ".join(kept)]) if kept else reason[: end + 1]


MORE_NODES = re.compile(r"and \d+ more nodes")


def _asked(verdicts: Sequence[NodeVerdict]) -> str | None:
    """What the pod asks of a card, said once (the cards' lines then give MiB only)."""
    for verdict in verdicts:
        for card in verdict.cards:
            if card.problem is CardProblem.TOO_LITTLE_MEMORY:
                return format_amount(card.need, card.unit_mib)
    return None


def _verdicts_table(verdicts: Sequence[NodeVerdict]) -> str:
    """A row per node: why not, and its cards in a few words (the largest free card once,
    then the cards that fail otherwise)."""
    rows = [("NODE", "WHY NOT", "CARDS")]
    rows += [(v.node, v.label, _cards_in_short(v)) for v in verdicts]
    return table(rows)


def _cards_in_short(verdict: NodeVerdict) -> str:
    if verdict.problem is NodeProblem.FILTERED:
        return "-"
    said = []
    if verdict.problem is NodeProblem.TOO_FEW_IDLE_CARDS or (verdict.detail and not verdict.cards):
        said.append(verdict.detail)
    short = [c for c in verdict.cards if c.problem is CardProblem.TOO_LITTLE_MEMORY]
    if short:
        most = max(c.free for c in short)
        cards = _indices([c for c in short if c.free == most])
        said.append(f"most free: {cards}, {most * short[0].unit_mib} MiB")
    for (problem, detail), group in groupby(
        (c for c in verdict.cards if c.problem is not CardProblem.TOO_LITTLE_MEMORY),
        key=lambda c: (c.problem, c.detail),
    ):
        said.append(f"{_indices(list(group))} {detail or problem.value}")
    return "; ".join(filter(None, said)) or "-"


def _indices(cards: Sequence[CardVerdict]) -> str:
    """`card 3`, `cards 0-7`, `cards 1, 4`: runs of consecutive cards written once."""
    numbers = [int(c.card) for c in cards]
    if len(numbers) == 1:
        return f"card {numbers[0]}"
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number == runs[-1][-1] + 1:
            runs[-1].append(number)
        else:
            runs.append([number])
    return "cards " + ", ".join(
        f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs
    )


def _verdicts_wide(report: Explanation, outcome: Unplaceable) -> str:
    """A row per card of every node: its model, free and total MiB, and why it does not
    take the pod."""
    rows = [("NODE", "WHY NOT", "CARD", "MODEL", "FREE MiB", "TOTAL MiB", "CARD PROBLEM")]
    for verdict in outcome.nodes:
        node = report.node_reports.get(verdict.node)
        cards = {card.index: card for card in node.cards} if node is not None else {}
        why = {card.card: card for card in verdict.cards}
        if not cards or verdict.problem is NodeProblem.FILTERED:
            rows.append((verdict.node, verdict.label, "-", "", "", "", verdict.detail or ""))
            continue
        for i, (index, card) in enumerate(sorted(cards.items())):
            problem = why.get(index)
            rows.append(
                (
                    verdict.node if i == 0 else "",
                    verdict.label if i == 0 else "",
                    str(index),
                    card.model,
                    str(card.total_mib - card.used_mib),
                    str(card.total_mib),
                    _card_problem(problem) if problem is not None else verdict.detail or "-",
                )
            )
    return table(rows)


def _card_problem(card: CardVerdict) -> str:
    if card.problem is CardProblem.RESERVED:
        return card.detail
    if card.problem is CardProblem.TOO_LITTLE_MEMORY:
        return f"{card.problem.value} (< {card.need * card.unit_mib})"
    return card.problem.value


def _card_lines(node: NodeReport | None, cards: str | None) -> list[str]:
    """-o wide: the named cards of `node` (a `gpu-index` value), one line each."""
    if node is None or not cards:
        return []
    named = {part.strip() for part in cards.split(",")}
    return [
        f"card {card.index}: {card.model or 'unknown model'} {card.uuid or ''}".rstrip()
        + f", {_health(card)}, {card.used_mib}/{card.total_mib} MiB allocated, "
        f"{card.pod_count} pod(s)"
        for card in node.cards
        if str(card.index) in named
    ]


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


def render_defrag(plan: DefragPlan, owners: Mapping[str, str] | None = None) -> str:
    """The plan in sentences; with `owners` (-o wide: each pod's controller, by uid), who
    makes each moved pod's replacement."""
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
            + (f", replaced by its {owners.get(move.pod.uid, 'controller')}" if owners else "")
            for move in room.moves
        ]
    lines += [f"still waiting: {pod}: {reason}" for pod, reason in plan.waiting]
    return "\n".join(lines)
