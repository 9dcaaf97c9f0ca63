"""What one scheduler's write costs the apiserver and etcd, variant against variant: the
writes in which the operator and kube-scheduler differ, each measured alone on one fresh
control plane. A benchmark, not a test: it prints a table and writes JSON.

    python bench/server_cost.py [--writes 2000] [--rounds 3] [--pod-shape workload|minimal]
                                [--only TEXT ...] [--json out.json]

Each variant sends `--writes` writes, 32 in flight (protobuf bodies on one HTTP/2 connection,
as the operator sends them; the JSON Events on HTTP/1.1, a connection each, as
kubernetes_asyncio sends them: results before 2026-12-06 had every write on HTTP/1.1), and is
charged the apiserver's and etcd's CPU from its
first write to its last answer; variants take turns over `--rounds` rounds, in a new order
each round, and each figure is the median over the rounds:
- Bindings of pending pods, as kube-scheduler sends them (node only) and as the operator does
  (with Volcano's annotations: gpu-index, predicate-time, gpu-assigned), also with the
  leader's term and its labels (an operator that elects a leader, as installed), which the
  shipped fence (the binding gpushare-leader-writes, holding that term) selects by label and
  does not judge, and judged by the fence before 2026-12-06 (a policy comparing each write's
  term with the Lease's, the Lease its parameter);
- Scheduled Events named by the sender (kube-scheduler's way) and by the apiserver from a
  `generateName` (the operator's), both JSON, and the operator's own (protobuf);
- the operator's Bindings with 512 in flight on as many connections (its default).
The pods bound are created beforehand and not charged: the smallest there are (`--pod-shape
minimal`, under 1 KiB in etcd), or as a Job creates them (`workload`, about 3 KiB).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
import yaml
from kubernetes_asyncio import client

from gpushare import kube
from gpushare.kube import protobuf
from gpushare.kube.http2 import Http2Writer
from gpushare.model import contract
from gpushare_harness import ControlPlane
from gpushare_harness.benchargs import positive
from gpushare_harness.benchpods import add_shape_argument, bench_pod
from gpushare_harness.benchreport import report
from gpushare_harness.identities import NAMESPACES, ROLES
from gpushare_harness.serverstats import counters, cpu_seconds

IN_FLIGHT = 32
OPERATOR_IN_FLIGHT = 512
NODES = 10
NAMESPACE = "cost"
POLICY_REFRESH_S = 3
"""The apiserver rebuilds its policies a second after they change; with margin."""


def volcano_annotations(number: int) -> dict[str, str]:
    return {
        contract.GPU_INDEX: str(number % 8),
        contract.PREDICATE_TIME: str(time.time_ns()),
        contract.GPU_ASSIGNED: contract.GPU_ASSIGNED_FALSE,
    }


def scheduled_event(pod: str, uid: str, *, name: str | None) -> dict[str, Any]:
    """A Scheduled Event as JSON: named `name`, or by the apiserver from a generateName."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    naming = {"name": name} if name else {"generateName": f"{pod}."}
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {**naming, "namespace": NAMESPACE},
        "involvedObject": {"kind": "Pod", "namespace": NAMESPACE, "name": pod, "uid": uid},
        "reason": "Scheduled",
        "message": f"Successfully assigned {NAMESPACE}/{pod} to node-0001",
        "source": {"component": "cost"},
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
        "type": "Normal",
        "reportingComponent": "cost",
        "reportingInstance": "cost-1",
    }


Write = Callable[[client.ApiClient, Http2Writer, int, dict[str, Any]], Awaitable[bytes]]


LEASE = ("gpushare-system", "gpushare-scheduler", "gpushare-operator-5d8f7c9b6-x2k4q", 3)
"""The Lease (namespace, name) and its term (holder, transitions) the writes are sent in."""
LEADER_TERM = "/".join(map(str, LEASE))
"""The term as an operator that elects writes it (Lease namespace/name/holder/transitions)."""
TERM_LABEL = f"{LEASE[3]}.8c1e4b2a-0d6f-4c3e-9a57-2b1f0e9d7c64"
FENCES = {
    "shipped": {
        contract.LEASE_LABEL: f"{LEASE[0]}.{LEASE[1]}",
        contract.LEASE_TERM_LABEL: TERM_LABEL,
    },
    "lease-policy": {"bench.gpushare.io/lease-param": "true"},
}
"""The labels a leader's write carries for each fence: the shipped one (the binding
gpushare-leader-writes, set to TERM_LABEL, selects the writes of other terms by label), and the
one before 2026-12-06 (PREVIOUS_FENCE)."""
PREVIOUS_FENCE = f"""
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {{name: {LEASE[1]}, namespace: {LEASE[0]}}}
spec: {{holderIdentity: {LEASE[2]}, leaseTransitions: {LEASE[3]}, leaseDurationSeconds: 15}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: previous-leader-writes}}
spec:
  failurePolicy: Fail
  paramKind: {{apiVersion: coordination.k8s.io/v1, kind: Lease}}
  matchConstraints:
    resourceRules:
      - {{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods/binding]}}
  variables:
    - name: sent
      expression: >-
        object.metadata.?annotations.orValue({{}})[?'{contract.LEADER_TERM}'].orValue('')
    - name: lease
      expression: params.metadata.namespace + '/' + params.metadata.name + '/'
    - name: current
      expression: >-
        variables.lease + params.spec.?holderIdentity.orValue('') + '/' +
        string(params.spec.?leaseTransitions.orValue(0))
  validations:
    - expression: >-
        !variables.sent.startsWith(variables.lease) || variables.sent == variables.current
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: previous-leader-writes}}
spec:
  policyName: previous-leader-writes
  validationActions: [Deny]
  paramRef: {{name: {LEASE[1]}, namespace: {LEASE[0]}, parameterNotFoundAction: Allow}}
  matchResources: {{objectSelector: {{matchLabels: {{bench.gpushare.io/lease-param: "true"}}}}}}
"""
"""The fence before 2026-12-06, as it was shipped, for comparison: a policy that compared each
write's term with the Lease, read as its parameter, and its binding."""


def bind(annotated: bool, *, fence: str | None = None) -> Write:
    """Bindings: the node only, with Volcano's annotations, and with the leader's term (its
    annotation, and its labels for `fence`, which the apiserver copies onto the pod as well)."""

    async def write(
        _api: client.ApiClient, writer: Http2Writer, number: int, pod: dict[str, Any]
    ) -> bytes:
        meta = pod["metadata"]
        annotations = volcano_annotations(number) if annotated else {}
        if fence:
            annotations[contract.LEADER_TERM] = LEADER_TERM
        body = protobuf.binding(
            namespace=NAMESPACE,
            name=meta["name"],
            uid=meta["uid"],
            annotations=annotations,
            labels=FENCES[fence] if fence else None,
            node=f"node-{number % NODES:04d}",
        )
        path = f"/api/v1/namespaces/{NAMESPACE}/pods/{meta['name']}/binding"
        return await writer.post_protobuf(path, body)

    return write


def announce(how: str) -> Write:
    """Scheduled Events: JSON named by the sender ("named", client-go's recorder: the pod's
    name, a dot, a hex timestamp), JSON with a generateName ("generated"), or the operator's
    own protobuf body with a generateName ("operator")."""

    async def write(
        api: client.ApiClient, writer: Http2Writer, _number: int, pod: dict[str, Any]
    ) -> bytes:
        meta = pod["metadata"]
        path = f"/api/v1/namespaces/{NAMESPACE}/events"
        if how == "operator":
            body = protobuf.event(
                namespace=NAMESPACE,
                name=meta["name"],
                uid=meta["uid"],
                event_type="Normal",
                reason="Scheduled",
                message=f"Successfully assigned {NAMESPACE}/{meta['name']} to node-0001",
                component="cost",
                instance="cost-1",
                at_s=int(time.time()),
            )
            return await writer.post_protobuf(path, body)
        name = f"{meta['name']}.{time.time_ns():x}" if how == "named" else None
        core = client.CoreV1Api(api)
        event = scheduled_event(meta["name"], meta["uid"], name=name)
        created = core.create_namespaced_event(
            NAMESPACE, cast(client.CoreV1Event, event), _preload_content=False
        )
        return json.dumps(await kube.raw_json(created)).encode()

    return write


VARIANTS: dict[str, tuple[Write, int]] = {
    "binding, node only (kube-scheduler)": (bind(annotated=False), IN_FLIGHT),
    "binding with annotations (operator)": (bind(annotated=True), IN_FLIGHT),
    "binding with annotations and the leader's term, the shipped fence": (
        bind(annotated=True, fence="shipped"),
        IN_FLIGHT,
    ),
    "binding with annotations and the leader's term, the fence before": (
        bind(annotated=True, fence="lease-policy"),
        IN_FLIGHT,
    ),
    "event named by the sender, JSON (kube-scheduler's naming)": (announce("named"), IN_FLIGHT),
    "event with generateName, JSON": (announce("generated"), IN_FLIGHT),
    "event with generateName, protobuf (operator)": (announce("operator"), IN_FLIGHT),
    "binding with annotations, 512 in flight": (bind(annotated=True), OPERATOR_IN_FLIGHT),
}


async def pending_pods(
    api: client.ApiClient, count: int, prefix: str, in_flight: int, shape: str
) -> list[dict[str, Any]]:
    """`count` pods in `shape` that no scheduler takes, created `in_flight` at a time: the
    variant's connections are opened (TLS handshakes and all) here, before its writes are
    measured."""
    core = client.CoreV1Api(api)
    limit = asyncio.Semaphore(in_flight)

    async def one(number: int) -> dict[str, Any]:
        name = f"{prefix}-{number}"
        body = bench_pod(name, number, scheduler="nobody", limits={}, shape=shape)
        async with limit:
            return await kube.raw_json(
                core.create_namespaced_pod(
                    NAMESPACE, cast(client.V1Pod, body), _preload_content=False
                )
            )

    return list(await asyncio.gather(*(one(n) for n in range(count))))


async def measure(
    plane: ControlPlane, label: str, round_number: int, writes: int, shape: str
) -> dict[str, float]:
    write, in_flight = VARIANTS[label]
    pids = [plane.pids()["kube-apiserver"], plane.pids()["etcd"]]
    assert plane.endpoints is not None
    etcd_url = plane.endpoints.etcd
    async with (
        await kube.api_client(plane.kubeconfig, connections=in_flight) as api,
        Http2Writer(api.configuration, timeout_s=60, user_agent="cost") as writer,
    ):
        prefix = f"r{round_number}-{list(VARIANTS).index(label)}"
        pods = await pending_pods(api, writes, prefix, in_flight, shape)
        limit = asyncio.Semaphore(in_flight)

        async def one(number: int, pod: dict[str, Any]) -> None:
            async with limit:
                await write(api, writer, number, pod)

        calls_before = await etcd_calls(etcd_url)
        before = [cpu_seconds(p) for p in pids]
        started = time.monotonic()
        await asyncio.gather(*(one(n, p) for n, p in enumerate(pods)))
        took = time.monotonic() - started
        after = [cpu_seconds(p) for p in pids]
        calls = await etcd_calls(etcd_url)
        calls.subtract(calls_before)
    apiserver, etcd = (b - a for a, b in zip(before, after, strict=True))
    return {
        "apiserver_ms_per_write": round(apiserver / writes * 1000, 3),
        "etcd_ms_per_write": round(etcd / writes * 1000, 3),
        "writes_per_s": round(writes / took),
    } | {f"etcd {what} per write": round(n / writes, 2) for what, n in calls.items() if n}


async def etcd_calls(url: str) -> Counter[str]:
    """etcd's calls by gRPC method, and the bytes it took in."""
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as answer:
        answer.raise_for_status()
        text = await answer.text()
    calls: Counter[str] = Counter()
    wanted = ("grpc_server_handled_total", "etcd_network_client_grpc_received_bytes_total")
    for _, labels, value in counters(text, wanted):
        calls[labels.get("grpc_method", "bytes in")] += int(value)
    return calls


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    plane = ControlPlane(workdir / "plane").start()
    labels = [label for label in VARIANTS if not args.only or any(o in label for o in args.only)]
    measured: dict[str, list[dict[str, float]]] = {label: [] for label in labels}
    try:
        async with await kube.api_client(plane.kubeconfig) as api:
            core = client.CoreV1Api(api)
            await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": NAMESPACE}}))
        install_fences(plane)
        for number in range(args.rounds):
            shift = number % len(labels)  # a new order each round: none always goes first
            for label in labels[shift:] + labels[:shift]:
                found = await measure(plane, label, number, args.writes, args.pod_shape)
                measured[label].append(found)
                print(f"round {number}, {label}: {found}", flush=True)
    finally:
        plane.stop()
    return {
        label: {
            key: round(statistics.median(r.get(key, 0) for r in rounds), 3)
            for key in dict.fromkeys(k for r in rounds for k in r)
        }
        | {"rounds": rounds}
        for label, rounds in measured.items()
    }


def install_fences(plane: ControlPlane) -> None:
    """The shipped fence, holding TERM_LABEL, and the one before, with its Lease; then a wait
    for the apiserver to rebuild its policies."""
    shipped = [
        doc
        for doc in yaml.safe_load_all(ROLES.joinpath("operator.yaml").read_text())
        if doc and doc["metadata"]["name"] == contract.FENCE_BINDING
    ]
    binding = next(d for d in shipped if d["kind"] == "ValidatingAdmissionPolicyBinding")
    binding["spec"]["matchResources"]["objectSelector"]["matchExpressions"][1]["values"] = [
        TERM_LABEL
    ]
    text = (
        yaml.safe_dump_all([*yaml.safe_load_all(NAMESPACES.read_text()), *shipped], sort_keys=False)
        + "---\n"
        + PREVIOUS_FENCE
    )
    kubectl = [str(plane.binaries.kubectl), "--kubeconfig", str(plane.kubeconfig)]
    subprocess.run([*kubectl, "apply", "-f", "-"], input=text, text=True, check=True)
    time.sleep(POLICY_REFRESH_S)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--writes", type=positive, default=2000)
    parser.add_argument("--rounds", type=positive, default=3)
    add_shape_argument(parser, default="minimal", pods="the pods bound")
    parser.add_argument(
        "--only", action="append", metavar="TEXT", help="the variants whose label has TEXT"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.only and not any(o in label for o in args.only for label in VARIANTS):
        parser.error(f"--only {args.only} names no variant; they are: {', '.join(VARIANTS)}")
    with tempfile.TemporaryDirectory(prefix="gpushare-cost-") as workdir:
        results = asyncio.run(run(args, Path(workdir)))
    report(f"{args.writes} writes per variant, {args.rounds} rounds", results, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
