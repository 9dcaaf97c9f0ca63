"""`gpushare` (also the kubectl plugin `kubectl gpushare`): what the GPUs hold, and why a pod
waits. One paged LIST of nodes, GPUNodes and pods, then the operator's own cache and decision
(`gpushare_operator.scheduling.decision.plan`) answer, so the CLI says what the scheduler
would. Only `defrag --apply` writes (evictions).

    gpushare inspect [NODE] [-d]        cards per node: model, used/total MiB, health (-d: pods)
    gpushare explain POD [-n NS]        where the pod is, or why it waits, card by card
    gpushare simulate -f pod.yaml       where the pod would go now, and why; nothing is written
    gpushare defrag [--apply]           the fewest pods to move so that the waiting pods fit;
                                        --apply moves them, one eviction at a time

`-o json` or `-o yaml` prints machine-readable output (the same document), `-o wide` more
columns (inspect: a row per card with its UUID; explain: every card). The kubeconfig is
kubectl's: --kubeconfig, else $KUBECONFIG, else ~/.kube/config, else the pod's service account.
With rights in one namespace only, what is not visible is said on stderr ("note:") and taken
from the GPUNodes where it can be. Exit status: 0 done, 1 the cluster or the pod could not be
read (or, `defrag --apply`, a move could not be made), 2 bad arguments, a bad file or a bad
GPUSHARE_* value; `simulate` also 3 when the pod would wait (it does not fit now, but would on
the cluster's nodes if other pods went) and 4 when it fits no node even with no other pod
(waiting will not help); `defrag` 3 when some waiting pods no plan places.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sys
from argparse import SUPPRESS
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from gpushare.model import GpuShareError
from gpushare.model.admission import admit
from gpushare.model.bodies import path, text
from gpushare_cli.act import apply_moves
from gpushare_cli.errors import CliError
from gpushare_cli.kubeconfig import Source, context_namespace, find
from gpushare_cli.read import Cluster, load_pod, read_cluster
from gpushare_cli.render import (
    DOCUMENTS,
    defrag_json,
    document,
    explain_json,
    inspect_json,
    render_defrag,
    render_explain,
    render_inspect,
)
from gpushare_cli.report import State, defrag, explain, find_pod, inspect

DISTRIBUTION = "kube-gpushare"
OUTPUTS = ("table", "wide", "json", "yaml")


def version_line() -> str:
    """`gpushare --version`: the installed distribution's version, and Python's."""
    try:
        installed = version(DISTRIBUTION)
    except PackageNotFoundError:
        installed = "unknown (not installed)"
    return f"gpushare {installed} ({DISTRIBUTION}, Python {platform.python_version()})"


def program_name(argv0: str) -> str:
    """How the user ran it: `kubectl gpushare` runs the kubectl-gpushare executable."""
    return "kubectl gpushare" if Path(argv0).name.startswith("kubectl-gpushare") else "gpushare"


def parser() -> argparse.ArgumentParser:
    # The global flags are accepted before or after the subcommand, as kubectl's are: each
    # parser has them, none sets a default (SUPPRESS), so one given after the subcommand is
    # not overwritten by the subparser's default (`_option` reads them).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kubeconfig",
        type=Path,
        default=SUPPRESS,
        help="default: $KUBECONFIG, else ~/.kube/config, else the pod's service account",
    )
    common.add_argument(
        "--context", default=SUPPRESS, help="the kubeconfig context (default: its current one)"
    )
    common.add_argument(
        "-n",
        "--namespace",
        default=SUPPRESS,
        help="the pod's namespace (default: the context's, else default); inspect -d: only "
        "this namespace's pods",
    )
    common.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        default=SUPPRESS,
        help="explain: find the pod by name in any namespace; inspect -d: every namespace's "
        "pods (its default)",
    )
    common.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default=SUPPRESS,
        help="default: table; wide: more columns; json and yaml: the same document",
    )
    common.add_argument(
        "--operator-namespace",
        default=SUPPRESS,
        help="where the operator's Lease is (default: $GPUSHARE_LEASE_NAMESPACE, else "
        "found: the Lease by name, else the admission webhook's namespace)",
    )
    parse = argparse.ArgumentParser(
        prog=program_name(sys.argv[0]),
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parse.add_argument("--version", action="version", version=version_line())
    commands = parse.add_subparsers(dest="command", required=True)
    inspect_cmd = commands.add_parser(
        "inspect",
        help="cards per node, used/total, health",
        description="Cards per node (or NODE's): model, used/total MiB, health; -d: one row "
        "per card with its pods (namespace, name, MiB).",
        parents=[common],
    )
    inspect_cmd.add_argument("node", nargs="?")
    inspect_cmd.add_argument(
        "-d", "--details", action="store_true", help="one row per card, with its pods"
    )
    explain_cmd = commands.add_parser(
        "explain",
        help="why a pod waits, card by card",
        description="Where POD is bound, or why it waits: every node, every card, as the "
        "leading operator decides.",
        parents=[common],
    )
    explain_cmd.add_argument("pod")
    simulate_cmd = commands.add_parser(
        "simulate",
        help="where a pod would go now (no writes)",
        description="Where the pod in FILENAME would go now, and why; nothing is written. "
        "Exit status 3: it would wait; 4: it fits no node even on an empty cluster.",
        parents=[common],
    )
    simulate_cmd.add_argument("-f", "--filename", required=True, help="a Pod manifest, - for stdin")
    defrag_cmd = commands.add_parser(
        "defrag",
        help="the fewest moves after which waiting pods fit",
        description="The fewest pods to move (controller-owned gpu-memory pods, evicted and "
        "placed again as their replacements) so that the pods waiting now fit, PodDisruption"
        "Budgets and gangs' minimums kept. Exit status 3: some waiting pods no plan places.",
        parents=[common],
    )
    mode = defrag_cmd.add_mutually_exclusive_group()
    mode.add_argument("--plan", action="store_true", help="print the plan (the default)")
    mode.add_argument(
        "--apply",
        action="store_true",
        help="carry it out: one eviction at a time, each waiting for its replacement to be "
        "bound; stops at a refused eviction",
    )
    return parse


def _option(args: argparse.Namespace, name: str, default: Any = None) -> Any:
    return getattr(args, name, default)


SIMULATE_STATUS = {State.UNPLACEABLE: 3, State.NEVER: 4}
"""`simulate`'s exit status by outcome (0 for the rest)."""


async def _run(args: argparse.Namespace) -> tuple[str, int]:
    """What to print, and the exit status."""
    output = _option(args, "output", "table")
    source = find(_option(args, "kubeconfig"), _option(args, "context"))
    every = bool(_option(args, "all_namespaces", False))
    namespace = _option(args, "namespace") or context_namespace(source)
    if args.command == "simulate":
        pod = load_pod(args.filename, namespace)  # a bad file fails before any cluster call
    cluster = await read_cluster(source, namespace, _option(args, "operator_namespace"))
    for line in cluster.unseen:
        print(f"note: {line}", file=sys.stderr)
    if args.command == "defrag":
        return await _defrag(args, source, cluster, output)
    if args.command == "inspect":
        only = None if every or _option(args, "namespace") is None else namespace
        nodes = inspect(cluster, args.node, namespace=only)
        if output in DOCUMENTS:
            return document(inspect_json(nodes), output), 0
        return render_inspect(nodes, args.details, wide=output == "wide"), 0
    status = 0
    if args.command == "explain":
        report = explain(cluster, find_pod(cluster, args.pod, None if every else namespace))
    else:
        report = explain(cluster, as_admitted(pod, cluster), simulated=True)
        status = SIMULATE_STATUS.get(report.outcome.state, 0)
    if output in DOCUMENTS:
        return document(explain_json(report), output), status
    return render_explain(report, wide=output == "wide"), status


async def _defrag(
    args: argparse.Namespace, source: Source, cluster: Cluster, output: str
) -> tuple[str, int]:
    plan = defrag(cluster)
    status = 3 if plan.waiting else 0
    if output in DOCUMENTS:
        shown = document(defrag_json(plan), output)
    else:
        shown = render_defrag(plan, owners=controllers(cluster) if output == "wide" else None)
    if not args.apply or not plan.moves:
        return shown, status
    print(shown, flush=True)
    await apply_moves(source, plan.moves, cluster.pods, lambda line: print(line, flush=True))
    return f"done: {len(plan.moves)} move(s); the scheduler places the waiting pods", status


def controllers(cluster: Cluster) -> dict[str, str]:
    """Each pod's controller as `Kind/name`, by the pod's uid (pods with one only)."""
    found = {}
    for pod in cluster.pods:
        meta = path(pod, "metadata")
        for owner in meta.get("ownerReferences") or ():
            if isinstance(owner, dict) and owner.get("controller") is True:
                found[text(meta.get("uid")) or ""] = f"{owner.get('kind')}/{owner.get('name')}"
    return found


def as_admitted(pod: dict[str, Any], cluster: Cluster) -> dict[str, Any]:
    """The pod as the admission webhook would store it (gpu-memory limits in the cluster's
    unit), or the refusal creating it would meet; as it is where no webhook is installed."""
    if not cluster.converts:
        return pod
    try:
        admit(pod, cluster.config.admission()).apply(pod)
    except GpuShareError as error:
        raise CliError(f"creating this pod would be refused: {error}", status=2) from error
    return pod


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        shown, status = asyncio.run(_run(args))
    except CliError as error:
        print(f"gpushare: {error}", file=sys.stderr)
        return error.status
    print(shown)
    return status


if __name__ == "__main__":
    sys.exit(main())
