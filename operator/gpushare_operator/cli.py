"""`gpushare` (also the kubectl plugin `kubectl gpushare`): what the GPUs hold, and why a pod
waits. Read-only: one LIST of nodes, GPUNodes and pods, then the operator's own cache and
decision (`gpushare_operator.decision.plan`) answer, so the CLI says what the scheduler would.

    gpushare inspect [NODE] [-d]        cards per node: model, used/total MiB, health (-d: pods)
    gpushare explain POD [-n NS]        where the pod is, or why it waits, card by card
    gpushare simulate -f pod.yaml       where the pod would go now, and why; nothing is written

`-o json` prints machine-readable output. Exit status: 0 done, 1 the cluster or the pod could
not be read, 2 bad arguments or a bad file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.config import ConfigException

from gpushare import kube
from gpushare.kube import ApiError
from gpushare.model import GpuShareError, NodeName, contract, diagnose, gpu_request
from gpushare.model.bodies import Body, annotations_of, path, text
from gpushare.model.diagnosis import Diagnosis, format_amount
from gpushare.model.filters import pod_needs
from gpushare.model.status import gpunode_status
from gpushare_operator.cache import SchedulerCache
from gpushare_operator.config import ConfigError, OperatorConfig, from_env, with_live
from gpushare_operator.decision import Plan, Refusal, plan

_READ_ATTEMPTS = 8  # about 10 s of waiting


class CliError(Exception):
    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, kw_only=True)
class Cluster:
    nodes: list[dict[str, Any]]
    gpunodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    config: OperatorConfig


async def read_cluster(kubeconfig: Path | None) -> Cluster:
    try:
        async with await kube.api_client(kubeconfig) as api:
            core = client.CoreV1Api(api)
            objects = client.CustomObjectsApi(api)
            nodes = await _read(lambda: core.list_node(_preload_content=False))
            pods = await _read(lambda: core.list_pod_for_all_namespaces(_preload_content=False))
            gpunodes = await _read(
                lambda: objects.list_cluster_custom_object(
                    contract.INVENTORY_GROUP,
                    contract.INVENTORY_VERSION,
                    contract.INVENTORY_PLURAL,
                    _preload_content=False,
                ),
                optional=True,
            )
            live = await _read(
                lambda: objects.get_cluster_custom_object(
                    contract.INVENTORY_GROUP,
                    contract.INVENTORY_VERSION,
                    "gpushareconfigs",
                    "default",
                    _preload_content=False,
                ),
                optional=True,
            )
    except (aiohttp.ClientError, OSError, TimeoutError) as error:
        raise CliError(
            f"cannot reach the cluster ({error}); check KUBECONFIG or --kubeconfig"
        ) from error
    except ConfigException as error:
        raise CliError(f"no usable kubeconfig ({error}); set KUBECONFIG or --kubeconfig") from error
    except ApiError as error:
        raise CliError(f"the cluster refused to list nodes and pods: {error}") from error
    config = from_env()
    spec = path(live, "spec")
    if spec:
        # The operator refuses an invalid one too, and keeps its environment's values.
        with contextlib.suppress(ConfigError):
            config = with_live(config, spec)
    return Cluster(nodes=_items(nodes), gpunodes=_items(gpunodes), pods=_items(pods), config=config)


async def _read(call: Callable[[], Awaitable[object]], *, optional: bool = False) -> dict[str, Any]:
    """One read, retried for a few seconds while the apiserver asks to wait (429, 503: it is
    starting or overloaded); with `optional`, a 404 (no CRDs, no live config) reads as empty."""
    delay = 0.25
    for _ in range(_READ_ATTEMPTS):
        try:
            return await kube.raw_json(call())
        except ApiError as error:
            if optional and error.status == 404:
                return {}
            if error.status not in (429, 503):
                raise
            last = error
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
    raise last


def _items(body: Body) -> list[dict[str, Any]]:
    return [item for item in body.get("items") or [] if isinstance(item, dict)]


def build_cache(cluster: Cluster) -> SchedulerCache:
    cache = SchedulerCache(
        scheduler_names=cluster.config.scheduler_names,
        assignment_timeout_s=cluster.config.assignment_timeout_s,
    )
    for node in cluster.nodes:
        cache.observe_node(node)
    for resource in cluster.gpunodes:
        cache.observe_gpunode(resource)
    for pod in cluster.pods:
        cache.observe_pod(pod)
    return cache


# -- inspect ---------------------------------------------------------------------------------


def inspect(cluster: Cluster, node: str | None) -> list[dict[str, Any]]:
    cache = build_cache(cluster)
    ledger = cache.ledger
    names = sorted(ledger.nodes())
    if node is not None:
        wanted = NodeName(node)
        if wanted not in ledger.nodes():
            if wanted not in ledger.nodes_without_gpu():
                raise CliError(f"node {node} not found")
            problem = ledger.nodes_without_gpu()[wanted]
            raise CliError(f"node {node} has no GPU" + (f": {problem}" if problem else ""))
        names = [wanted]
    report = []
    for name in names:
        usage = ledger.nodes()[name]
        status = gpunode_status(usage)
        inventory = usage.inventory
        cards = []
        for entry in status["cards"]:
            card = inventory.card(entry["index"])
            assert card is not None
            cards.append(
                {
                    "index": entry["index"],
                    "model": card.model or "",
                    "uuid": card.uuid or "",
                    "health": contract.HEALTHY if entry["healthy"] else contract.UNHEALTHY,
                    "usedMiB": entry["allocatedMiB"],
                    "totalMiB": card.memory * inventory.unit_mib,
                    "pods": entry["pods"],
                }
            )
        report.append(
            {
                "node": name,
                "source": inventory.source.value,
                "unitMiB": inventory.unit_mib,
                "usedMiB": status["allocatedMiB"],
                "totalMiB": status["totalMiB"],
                "cards": cards,
            }
        )
    return report


def render_inspect(report: list[dict[str, Any]], detail: bool) -> str:
    if not report:
        return "no GPU nodes"
    if detail:
        rows = [("NODE", "CARD", "MODEL", "USED/TOTAL MiB", "HEALTH", "PODS")]
        for node in report:
            for i, card in enumerate(node["cards"]):
                rows.append(
                    (
                        node["node"] if i == 0 else "",
                        str(card["index"]),
                        card["model"],
                        f"{card['usedMiB']}/{card['totalMiB']}",
                        card["health"],
                        ", ".join(card["pods"]) or "-",
                    )
                )
            rows.append(("", "total", "", f"{node['usedMiB']}/{node['totalMiB']}", "", ""))
        return _table(rows)
    most = max(len(node["cards"]) for node in report)
    head = ("NODE", *(f"GPU{i}(Used/Total)" for i in range(most)), "GPU MEMORY MiB")
    lines: list[tuple[str, ...]] = [head]
    for node in report:
        cells = [
            f"{c['usedMiB']}/{c['totalMiB']}" + ("" if c["health"] == contract.HEALTHY else "!")
            for c in node["cards"]
        ]
        cells += [""] * (most - len(cells))
        lines.append((node["node"], *cells, f"{node['usedMiB']}/{node['totalMiB']}"))
    used = sum(n["usedMiB"] for n in report)
    total = sum(n["totalMiB"] for n in report)
    share = f"{100 * used // total}%" if total else "0%"
    return (
        _table(lines)
        + f"\nallocated/total GPU memory in the cluster: {used}/{total} MiB ({share})"
        + (
            "\n(! marks an unhealthy card)"
            if any(c["health"] != contract.HEALTHY for n in report for c in n["cards"])
            else ""
        )
    )


# -- explain and simulate --------------------------------------------------------------------


def explain(cluster: Cluster, pod: Body, *, simulated: bool = False) -> dict[str, Any]:
    """Where `pod` is, or would go now, and why; card by card when it cannot go anywhere."""
    meta = path(pod, "metadata")
    name = f"{text(meta.get('namespace')) or 'default'}/{text(meta.get('name')) or '<unnamed>'}"
    annotations = annotations_of(pod)
    scheduler = text(path(pod, "spec").get("schedulerName")) or "default-scheduler"
    report: dict[str, Any] = {"pod": name, "schedulerName": scheduler}
    node = text(path(pod, "spec").get("nodeName"))
    if not simulated and node:
        report.update(
            state="bound",
            node=node,
            card=annotations.get(contract.GPU_INDEX),
            assigned=annotations.get(contract.GPU_ASSIGNED) == contract.GPU_ASSIGNED_TRUE,
            phase=text(path(pod, "status").get("phase")),
        )
        return report
    if scheduler not in cluster.config.scheduler_names:
        report["note"] = (
            f"spec.schedulerName {scheduler!r} is not one the gpushare operator serves "
            f"({', '.join(sorted(cluster.config.scheduler_names))}): it will not place this pod"
        )
    if not simulated:
        for condition in path(pod, "status").get("conditions") or []:
            if isinstance(condition, dict) and condition.get("type") == "PodScheduled":
                report["schedulerSays"] = condition.get("message")
    cache = build_cache(cluster)
    outcome = plan(cache, pod, cluster.config.policy)
    report["policy"] = cluster.config.policy.value
    if isinstance(outcome, Plan):
        report.update(state="would be placed now" if simulated else "placeable now")
        report["node"] = outcome.node
        if outcome.placement is not None:
            placement = outcome.placement
            report["cards"] = list(placement.cards)
            report["freeLeft"] = (
                format_amount(placement.free_after, placement.unit_mib)
                if placement.kind.value == contract.GPU_MEMORY
                else f"{placement.free_after} idle cards"
            )
        return report
    report.update(state="cannot be placed now", reason=outcome.message)
    report["nodes"] = _verdicts(cache, pod, outcome)
    return report


def _verdicts(cache: SchedulerCache, pod: Body, refusal: Refusal) -> list[dict[str, Any]]:
    try:
        request = gpu_request(pod)
        needs = pod_needs(pod)
    except GpuShareError:
        return []
    if request.kind is None:
        return []
    diagnosis: Diagnosis = diagnose(
        cache.ledger, request, cache.node_check(needs), cache.card_check(request)
    )
    return [
        {
            "node": verdict.node,
            "problem": verdict.label,
            "cards": [str(card) for card in verdict.cards],
        }
        for verdict in diagnosis.nodes
    ]


def render_explain(report: dict[str, Any]) -> str:
    lines = [f"pod {report['pod']} (schedulerName {report['schedulerName']})"]
    if note := report.get("note"):
        lines.append(f"note: {note}")
    state = report["state"]
    if state == "bound":
        assigned = "served by the device plugin" if report["assigned"] else "not yet started"
        lines.append(
            f"bound to {report['node']}, card {report['card'] or '-'}; {assigned}; "
            f"phase {report['phase']}"
        )
        return "\n".join(lines)
    if says := report.get("schedulerSays"):
        lines.append(f"the scheduler says: {says}")
    if "cards" in report or state != "cannot be placed now":
        where = report["node"] + (
            f" card {','.join(map(str, report['cards']))} ({report['freeLeft']} left)"
            if "cards" in report
            else ""
        )
        lines.append(f"{state} ({report['policy']}): {where}")
        return "\n".join(lines)
    lines.append(f"{state}: {report['reason']}")
    if report["nodes"]:
        rows = [("NODE", "WHY NOT", "CARDS")]
        rows += [(v["node"], v["problem"], "; ".join(v["cards"]) or "-") for v in report["nodes"]]
        lines.append(_table(rows))
    return "\n".join(lines)


def load_pod(file: str) -> dict[str, Any]:
    try:
        text_in = sys.stdin.read() if file == "-" else Path(file).read_text()
        body = yaml.safe_load(text_in)
    except OSError as error:
        raise CliError(f"cannot read {file}: {error}", status=2) from error
    except yaml.YAMLError as error:
        raise CliError(f"{file} is not valid YAML: {error}", status=2) from error
    if not isinstance(body, dict) or body.get("kind") != "Pod":
        raise CliError(f"{file} must hold one Pod manifest (kind: Pod)", status=2)
    meta = body.setdefault("metadata", {})
    if not isinstance(meta, dict):
        raise CliError(f"{file}: metadata must be a mapping", status=2)
    meta.setdefault("namespace", "default")
    meta.setdefault("uid", f"simulated-{uuid.uuid4()}")
    body.setdefault("status", {"phase": "Pending"})
    spec = body.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("containers"), list):
        raise CliError(f"{file}: spec.containers is missing", status=2)
    spec.pop("nodeName", None)
    return body


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


# -- entry point -----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(
        prog="gpushare", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parse.add_argument("--kubeconfig", type=Path, help="default: $KUBECONFIG, in-cluster")
    commands = parse.add_subparsers(dest="command", required=True)
    inspect_cmd = commands.add_parser("inspect", help="cards per node, used/total, health")
    inspect_cmd.add_argument("node", nargs="?")
    inspect_cmd.add_argument("-d", "--details", action="store_true", help="one row per card")
    explain_cmd = commands.add_parser("explain", help="why a pod waits, card by card")
    explain_cmd.add_argument("pod")
    explain_cmd.add_argument("-n", "--namespace", default="default")
    simulate_cmd = commands.add_parser("simulate", help="where a pod would go now (no writes)")
    simulate_cmd.add_argument("-f", "--filename", required=True, help="a Pod manifest, - for stdin")
    for command in (inspect_cmd, explain_cmd, simulate_cmd):
        command.add_argument("-o", "--output", choices=("table", "json"), default="table")
    return parse


async def _run(args: argparse.Namespace) -> str:
    if args.command == "simulate":
        pod = load_pod(args.filename)  # a bad file fails before any cluster call
    cluster = await read_cluster(args.kubeconfig)
    if args.command == "inspect":
        report = inspect(cluster, args.node)
        return (
            json.dumps(report, indent=2)
            if args.output == "json"
            else render_inspect(report, args.details)
        )
    if args.command == "explain":
        found = [
            p
            for p in cluster.pods
            if path(p, "metadata").get("name") == args.pod
            and path(p, "metadata").get("namespace") == args.namespace
        ]
        if not found:
            raise CliError(f"pod {args.namespace}/{args.pod} not found")
        result = explain(cluster, found[0])
    else:
        result = explain(cluster, pod, simulated=True)
    return json.dumps(result, indent=2) if args.output == "json" else render_explain(result)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        print(asyncio.run(_run(args)))
    except CliError as error:
        print(f"gpushare: {error}", file=sys.stderr)
        return error.status
    return 0


if __name__ == "__main__":
    sys.exit(main())
