"""`gpushare` (also the kubectl plugin `kubectl gpushare`): what the GPUs hold, and why a pod
waits. Read-only: one paged LIST of nodes, GPUNodes and pods, then the operator's own cache
and decision (`gpushare_operator.decision.plan`) answer, so the CLI says what the scheduler
would.

    gpushare inspect [NODE] [-d]        cards per node: model, used/total MiB, health (-d: pods)
    gpushare explain POD [-n NS]        where the pod is, or why it waits, card by card
    gpushare simulate -f pod.yaml       where the pod would go now, and why; nothing is written

`-o json` prints machine-readable output. Exit status: 0 done, 1 the cluster or the pod could
not be read, 2 bad arguments or a bad file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpushare.model import GpuShareError
from gpushare.model.admission import admit
from gpushare_cli.errors import CliError
from gpushare_cli.read import Cluster, load_pod, read_cluster
from gpushare_cli.render import explain_json, inspect_json, render_explain, render_inspect
from gpushare_cli.report import explain, find_pod, inspect


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
    as_json = args.output == "json"
    if args.command == "simulate":
        pod = load_pod(args.filename)  # a bad file fails before any cluster call
    cluster = await read_cluster(args.kubeconfig)
    if args.command == "inspect":
        nodes = inspect(cluster, args.node)
        if as_json:
            return json.dumps(inspect_json(nodes), indent=2)
        return render_inspect(nodes, args.details)
    if args.command == "explain":
        report = explain(cluster, find_pod(cluster, args.pod, args.namespace))
    else:
        report = explain(cluster, as_admitted(pod, cluster), simulated=True)
    return json.dumps(explain_json(report), indent=2) if as_json else render_explain(report)


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
        print(asyncio.run(_run(args)))
    except CliError as error:
        print(f"gpushare: {error}", file=sys.stderr)
        return error.status
    return 0


if __name__ == "__main__":
    sys.exit(main())
