"""The operator against kube-scheduler on the same apiserver, and the apiserver's own limit.
A benchmark, not a test: it prints a table and writes JSON; nothing asserts on time.

    python bench/operator.py [--nodes 200] [--cards 8] [--pods 2000] [--single 50] [--rounds 5]
                             [--server-cpus 0] [--same-pods] [--leader-elect]
    python bench/operator.py --gang-size 8 [--gang-mib 8192] [--nodes 200] [--pods 1600]

The pods are the smallest there are (`--pod-shape minimal`, under 1 KiB in etcd), or as a Job
creates them (`workload`: labels, owner, token volume, tolerations, env; about 3 KiB).

One fresh control plane with N fake nodes x 8 cards (11178 MiB); then, one after another,
each scheduler alone on it (the pods and Events of the one before deleted; etcd's history is
not compacted during the run, so that no phase pays for a compaction):
- raw: how fast the apiserver takes Bindings (the operator's own, in protobuf, with the UID
  precondition and annotations) from a client that is not the limit: two processes of their
  own, 32 Bindings in flight each, binding P pods created beforehand;
- kube-scheduler (v1.36.3, built from the pinned module, its own profile name), once with its
  client limit raised to 5,000 requests/s so that the apiserver is the limit, once at its
  default (50/s); it places the pods by the nodes' `volcano.sh/gpu-memory` totals only;
- the operator (`python -m gpushare_operator`) with its shipped Lease and status timings.
Neither elects a leader unless `--leader-elect`: then both do, as clusters run them,
kube-scheduler with its defaults (its Lease `kube-system/kube-scheduler`, renewed every 2 s)
and the operator as shipped (the same timings; its Bindings then carry the Lease's term and
its labels, which the leader fence's binding compares with the term the leader set on it).
Each scheduler runs on its own identity, as clusters run them: kube-scheduler on a client
certificate for `system:kube-scheduler` (kubeadm's scheduler.conf), the operator on its
ServiceAccount's token with the shipped roles, policies and FlowSchema applied; so the
apiserver authenticates, authorizes and queues (API Priority and Fairness: both in
`workload-high`) each as it would in a cluster. The benchmark's own calls and the stand-in's
are the admin's.
A stand-in in a process of its own marks every bound pod `gpu-assigned` as the device plugins
would, in every scheduler's phase: the node's write of a GPU pod is the same whoever placed it,
so each scheduler is measured with the same load on the apiserver per pod (the Binding and its
Event are the scheduler's own).
For each: backlog (P pods pending before it starts; pods bound per second from its first
bind to its last, and its CPU seconds per 1,000 pods over that time), burst (P pods created
while it runs, 32 creates in flight; pods bound per second from the first create, and
create-to-bound p50 and p99), single pods (created one at a time into the idle cluster,
create-to-bound p50 and p99), and its resident memory at the end. The apiserver's and etcd's
CPU per 1,000 pods is taken over the backlog (from the scheduler's start), over the burst (from
its first create) and over the whole phase, each until every pod of it is done: bound, marked
`gpu-assigned` by the stand-in and announced by its Scheduled Event, so that writes a scheduler
defers count too (the stand-in's PATCHes are in it for either scheduler, and the burst's and
single pods' creates; the backlog is created before its window).
Times are seen by watches in this process. Each phase reports the requests per pod: the
apiserver's by verb and resource (a 429 answered and sent again counts twice), its
authentications, its requests to etcd, and etcd's calls, watch events and bytes; each
server's context switches (voluntary: idle and woken; involuntary: put off its CPU) and read
and write calls per pod, over the phase and over the burst. Over the burst until its last
bind: the CPU per 1,000 pods of the scheduler and of the load (this process's creates and
watches, the stand-in), and each CPU's busy share (`burst_cpu_busy`: which core bounds the
rate); and how long after its bind each pod's Scheduled Event was seen (p50, p99).
`--profile DIR` writes the apiserver's and etcd's CPU profiles of each phase (pprof) there,
what each allocated in the phase, and the apiserver's execution trace of 3 s in each burst
(read it with `bench/tracewake`).

With `--same-pods`, kube-scheduler's pods end as the operator's do: the stand-in's PATCH gives
them Volcano's gpu-index and predicate-time with gpu-assigned, the record that the operator's
Binding leaves and that any GPU-sharing scheduler on Volcano's contract must leave, so that
both phases store, watch and serve the same pods (the write happens later for
kube-scheduler's: after its Binding, not in it).

With `--server-cpus`, the apiserver and etcd run on those CPUs and everything else on the
others: a scheduler's own CPU then takes none of the servers', and their CPU per pod stops
moving with it (the rounds agree within a few per cent instead of a quarter).

The apiserver's rate moves by a quarter from one minute to the next on these shared cores, so
kube-scheduler (raised) and the operator are measured `--rounds` times each, taking turns
(each goes first in every other round); each figure is its median over the rounds, and each
ratio the median of the rounds' own ratios (all of them are in the JSON). kube-scheduler at
its default limit runs once, after the rounds.

With `--gang-size K`: the operator alone, its backlog of P single pods of `--gang-mib` MiB,
then of P such pods in gangs of K (Volcano PodGroups, minMember K): bound per second and CPU
per 1,000 pods of each, and the ratio, in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import aiohttp
from kubernetes_asyncio import client, watch

from gpushare import kube
from gpushare.model import contract, pod_ref
from gpushare.model.annotations import gpu_assigned
from gpushare.model.gangs import VOLCANO_GROUP_ANNOTATIONS, GroupApi
from gpushare_harness import ControlPlane, FakeGpuNode, create_gpu_node
from gpushare_harness.benchargs import cpu_list, env_setting, positive
from gpushare_harness.benchpods import add_shape_argument, bench_pod
from gpushare_harness.binaries import ensure_binaries
from gpushare_harness.controlplane import free_port
from gpushare_harness.crds import install_crds, install_podgroup_crds
from gpushare_harness.identities import install_roles, operator_kubeconfig
from gpushare_harness.operator import OperatorProcess
from gpushare_harness.serverstats import (
    PROCESS_COUNTED,
    counters,
    cpu_busy,
    cpu_seconds,
    cpu_times,
    process_counts,
    rss_mib,
)
from gpushare_harness.standin import act_as_device_plugins
from gpushare_operator.config import OPTIONS, OperatorConfig
from gpushare_operator.kubeapi import KubeSchedulerApi

CARD_MIB = 11178
FLOW_SCHEMA = Path(__file__).resolve().parents[1] / "manifests/base/operator/flow-schema.yaml"
IN_FLIGHT = 32
RAW_PROCESSES = 2
KUBE_SCHEDULER_RAISED_QPS = 5000
STAND_IN_IN_FLIGHT = 256
"""The device plugins' PATCHes at once, each on a connection of its own (a kubelet per node)."""


async def create_pods(
    core: client.CoreV1Api,
    namespace: str,
    names: list[str],
    scheduler: str,
    *,
    shape: str,
    mib: int = 1024,
    gang_size: int = 0,
) -> dict[str, float]:
    """Creates the pods in `shape` (`benchpods`), IN_FLIGHT at a time; returns when each
    create was answered. With `gang_size`, each run of that many pods is a gang (its PodGroup
    created first)."""
    limit = asyncio.Semaphore(IN_FLIGHT)
    created: dict[str, float] = {}
    if gang_size:
        volcano = GroupApi.VOLCANO
        objects = client.CustomObjectsApi(core.api_client)  # type: ignore[attr-defined]
        for first in range(0, len(names), gang_size):
            await objects.create_namespaced_custom_object(
                volcano.group,
                volcano.version,
                namespace,
                "podgroups",
                {
                    "apiVersion": f"{volcano.group}/{volcano.version}",
                    "kind": "PodGroup",
                    "metadata": {"name": f"gang-{first // gang_size}"},
                    "spec": {"minMember": gang_size},
                },
            )

    async def one(number: int, name: str) -> None:
        group = {VOLCANO_GROUP_ANNOTATIONS[0]: f"gang-{number // gang_size}"} if gang_size else None
        body = bench_pod(
            name,
            number,
            scheduler=scheduler,
            limits={contract.GPU_MEMORY: str(mib)},
            shape=shape,
            annotations=group,
        )
        async with limit:
            await kube.raw_json(
                core.create_namespaced_pod(
                    namespace, cast(client.V1Pod, body), _preload_content=False
                )
            )
            created[name] = time.monotonic()

    await asyncio.gather(*(one(number, name) for number, name in enumerate(names)))
    return created


@dataclass
class Binds:
    """When watches in this process first showed each pod of the benchmark bound, marked
    `gpu-assigned` by the stand-in, and with its Scheduled Event (monotonic): a pod is done
    when all three are seen, every write its scheduling costs the apiserver made."""

    at: dict[str, float] = field(default_factory=dict)
    assigned: dict[str, float] = field(default_factory=dict)
    announced: dict[str, float] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    on_bind: Callable[[], None] | None = None
    watches: list[asyncio.Task[None]] = field(default_factory=list)
    """The two watches: one that ends leaves `wait` nothing to wait for."""

    async def watch(self, api: client.ApiClient, ready: asyncio.Event) -> None:
        list_call = client.CoreV1Api(api).list_pod_for_all_namespaces
        await self._follow(list_call, ready, self._pod_seen)

    async def watch_events(self, api: client.ApiClient, ready: asyncio.Event) -> None:
        """Scheduled Events, kube-scheduler's (events.k8s.io) and the operator's (core) alike."""
        list_call = client.CoreV1Api(api).list_event_for_all_namespaces
        await self._follow(list_call, ready, self._event_seen)

    @staticmethod
    async def _follow(
        list_call: Callable[..., Any], ready: asyncio.Event, seen: Callable[[dict[str, Any]], None]
    ) -> None:
        async with watch.Watch() as stream:
            ready.set()
            async for event in stream.stream(list_call, _request_timeout=3600):
                seen(event["raw_object"])

    def _pod_seen(self, pod: dict[str, Any]) -> None:
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        if pod["spec"].get("nodeName") and key not in self.at:
            self.at[key] = time.monotonic()
            if self.on_bind is not None:
                self.on_bind()
            self.changed.set()
        if gpu_assigned(pod["metadata"].get("annotations") or {}) and key not in self.assigned:
            self.assigned[key] = time.monotonic()
            self.changed.set()

    def _event_seen(self, event: dict[str, Any]) -> None:
        regarding = event.get("involvedObject") or {}
        key = f"{regarding.get('namespace')}/{regarding.get('name')}"
        if event.get("reason") == "Scheduled" and key not in self.announced:
            self.announced[key] = time.monotonic()
            self.changed.set()

    def _seen(self, key: str, *, done: bool) -> bool:
        if not done:
            return key in self.at
        return key in self.at and key in self.assigned and key in self.announced

    async def wait(self, keys: list[str], timeout_s: float = 900, *, done: bool = False) -> None:
        """Until every pod of `keys` is bound (`done`: and assigned, and announced)."""
        deadline = time.monotonic() + timeout_s
        while not all(self._seen(k, done=done) for k in keys):
            self.changed.clear()
            for watch_task in self.watches:
                if watch_task.done():
                    raise RuntimeError(f"a watch of the benchmark ended: {watch_task!r}")
            left = deadline - time.monotonic()
            if left <= 0:
                missing = {
                    step: sum(1 for k in keys if k not in seen)
                    for step, seen in (
                        ("bound", self.at),
                        ("assigned", self.assigned),
                        ("announced", self.announced),
                    )
                }
                raise TimeoutError(f"of {len(keys)} pods, after {timeout_s} s, not: {missing}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), timeout=left)


def median_round(measured: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds, and each count's of the requests per pod (a count
    missing from a round was under 0.01 per pod there)."""
    medians: dict[str, Any] = {}
    for key, value in measured[0].items():
        if isinstance(value, int | float):
            medians[key] = round(statistics.median(m[key] for m in measured), 2)
        elif isinstance(value, dict):
            counted = sorted({what for m in measured for what in m[key]})
            medians[key] = {
                what: round(statistics.median(m[key].get(what, 0) for m in measured), 2)
                for what in counted
            }
        else:
            medians[key] = value
    return medians


def ratio(operator: float, kube_scheduler: float) -> float | None:
    """The operator's figure over kube-scheduler's; None where kube-scheduler's is 0."""
    return round(operator / kube_scheduler, 2) if kube_scheduler else None


def median_known(ratios: list[float | None]) -> float | None:
    """The median of the ratios there are (None: none)."""
    known = [r for r in ratios if r is not None]
    return round(statistics.median(known), 2) if known else None


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


async def empty(core: client.CoreV1Api, namespace: str) -> None:
    """Deletes the phase's pods and Events: the next phase starts on as much stored data
    (and as large a heap in the apiserver) as this one did."""
    await core.delete_collection_namespaced_event(namespace)
    await core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    for _ in range(1200):
        listed = await kube.raw_json(
            core.list_namespaced_pod(namespace, limit=1, _preload_content=False)
        )
        if not listed["items"]:
            return
        await asyncio.sleep(0.25)
    raise TimeoutError(f"pods of namespace {namespace} not gone after 300 s")


class Scheduler(Protocol):
    """One of the schedulers compared."""

    label: str
    """Its results' key, and the namespace of its pods."""
    name: str
    """The schedulerName it serves."""

    def start(self) -> int:
        """Start it; its pid."""
        ...

    def stop(self) -> None: ...


async def measure(
    api: client.ApiClient,
    binds: Binds,
    scheduler: Scheduler,
    args: argparse.Namespace,
    namespace: str,
    *,
    servers: Servers,
    load: Mapping[str, int],
    profiles: Callable[[str], ServerProfiles] | None = None,
) -> dict[str, Any]:
    """One scheduler's phase. `load`: the processes of the load (this benchmark's creates and
    watches, the stand-in), whose CPU over the burst is reported beside the scheduler's."""
    core = client.CoreV1Api(api)
    await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": namespace}}))
    backlog = [f"backlog-{i}" for i in range(args.pods)]
    await create_pods(core, namespace, backlog, scheduler.name, shape=args.pod_shape)
    profile = profiles(namespace) if profiles is not None else None
    if profile is not None:  # before the phase's counts: its snapshot collects the garbage
        await profile.start()
    requests_before = await server_requests(api, servers.etcd)
    counts_before = servers.counts()
    server_before = servers.cpu_seconds()
    pid = scheduler.start()
    pods = 2 * args.pods + args.single
    try:
        keys = [f"{namespace}/{n}" for n in backlog]
        backlog_rate, cpu_per_1000 = await backlog_bound(binds, pid, keys)
        await binds.wait(keys, done=True)
        backlog_server = servers.total_cpu_seconds() - sum(server_before.values())

        burst = await measure_burst(
            core,
            binds,
            scheduler.name,
            namespace,
            args,
            servers=servers,
            clients={**load, "scheduler": pid},
            profile=profile,
        )

        single = []
        for number in range(args.single):
            name = f"single-{number}"
            answered = (
                await create_pods(core, namespace, [name], scheduler.name, shape=args.pod_shape)
            )[name]
            await binds.wait([f"{namespace}/{name}"], timeout_s=60)
            single.append(binds.at[f"{namespace}/{name}"] - answered)
            await binds.wait([f"{namespace}/{name}"], timeout_s=60, done=True)
        server_phase = {
            name: seconds - server_before[name] for name, seconds in servers.cpu_seconds().items()
        }
        counts = since(counts_before, servers.counts())  # before the metrics' own reads
        memory = rss_mib(pid)
        requests = await server_requests(api, servers.etcd)  # before the profiles' own work
    finally:
        binds.on_bind = None
        scheduler.stop()
        if profile is not None:
            await profile.stop()
    requests.subtract(requests_before)
    await empty(core, namespace)
    return {
        "backlog_bound_per_s": round(backlog_rate),
        "backlog_cpu_s_per_1000_pods": round(cpu_per_1000, 2),
        "backlog_server_cpu_s_per_1000_pods": round(backlog_server / args.pods * 1000, 2),
        "server_cpu_s_per_1000_pods": round(sum(server_phase.values()) / pods * 1000, 2),
        "apiserver_cpu_s_per_1000_pods": round(server_phase["kube-apiserver"] / pods * 1000, 2),
        "etcd_cpu_s_per_1000_pods": round(server_phase["etcd"] / pods * 1000, 2),
        **{f"{what}_per_pod": round(counts[what] / pods, 2) for what in SERVER_COUNTED},
        **burst,
        "single_create_to_bound_p50_ms": round(statistics.median(single) * 1000, 1),
        "single_create_to_bound_p99_ms": round(percentile(single, 0.99) * 1000, 1),
        "rss_mib": memory,
        "server_requests_per_pod": {
            what: round(count / pods, 2)
            for what, count in requests.most_common()
            if count / pods >= 0.01
        },
    }


async def measure_burst(
    core: client.CoreV1Api,
    binds: Binds,
    scheduler: str,
    namespace: str,
    args: argparse.Namespace,
    *,
    servers: Servers,
    clients: Mapping[str, int],
    profile: ServerProfiles | None,
) -> dict[str, Any]:
    """P pods created while `scheduler` runs: its rate, latencies, the servers' CPU and
    counts per pod until every pod is done, and, until the last is bound, the CPU per pod of
    each of `clients` and each CPU's busy share (which of the cores bounds the rate); how long
    after its bind each pod's Scheduled Event was seen."""
    names = [f"burst-{i}" for i in range(args.pods)]
    keys = [f"{namespace}/{n}" for n in names]
    server_before = servers.total_cpu_seconds()
    counts_before = servers.counts()
    cpus_before = cpu_times()
    clients_before = cpu_of(clients)
    started = time.monotonic()

    tracing = asyncio.create_task(profile.trace("burst")) if profile is not None else None
    try:
        created = await create_pods(core, namespace, names, scheduler, shape=args.pod_shape)
        await binds.wait(keys)
        cpus = cpu_busy(cpus_before, cpu_times())
        clients_cpu = {name: s - clients_before[name] for name, s in cpu_of(clients).items()}
        if tracing is not None:
            await tracing
    finally:
        if tracing is not None:
            tracing.cancel()
    bound = {n: binds.at[f"{namespace}/{n}"] for n in names}
    rate = len(names) / (max(bound.values()) - started)
    latencies = [bound[n] - created[n] for n in names]
    await binds.wait(keys, done=True)
    server = servers.total_cpu_seconds() - server_before
    counts = since(counts_before, servers.counts())
    announced = [binds.announced[f"{namespace}/{n}"] - bound[n] for n in names]
    return {
        "burst_server_cpu_s_per_1000_pods": round(server / args.pods * 1000, 2),
        **{f"burst_{what}_per_pod": round(counts[what] / args.pods, 2) for what in SERVER_COUNTED},
        "burst_bound_per_s": round(rate),
        **{
            f"burst_{name}_cpu_s_per_1000_pods": round(seconds / args.pods * 1000, 2)
            for name, seconds in clients_cpu.items()
        },
        "burst_cpu_busy": {str(cpu): share for cpu, share in cpus.items()},
        "burst_create_to_bound_p50_ms": round(statistics.median(latencies) * 1000),
        "burst_create_to_bound_p99_ms": round(percentile(latencies, 0.99) * 1000),
        "burst_bound_to_event_p50_ms": round(statistics.median(announced) * 1000),
        "burst_bound_to_event_p99_ms": round(percentile(announced, 0.99) * 1000),
    }


def cpu_of(pids: Mapping[str, int]) -> dict[str, float]:
    return {name: cpu_seconds(pid) for name, pid in pids.items()}


SERVER_SHORT = {"kube-apiserver": "apiserver", "etcd": "etcd"}
SERVER_COUNTED = tuple(
    f"{short}_{what}" for short in SERVER_SHORT.values() for what in PROCESS_COUNTED
)
"""Each server's context switches and read and write calls, per pod over the phase and over
the burst: how often it went idle and was woken, or was put off its CPU, for the same work."""


def since(before: Mapping[str, int], now: Mapping[str, int]) -> dict[str, int]:
    """Each count's growth (negative kept: a thread that ended took its switches with it)."""
    return {what: count - before[what] for what, count in now.items()}


GO_RUNTIME_COUNTED = ("go_memstats_alloc_bytes_total",)
"""Each server's bytes allocated on its heap: work counted rather than timed, so that a phase's
per pod moves by under 2 % from one round to the next where its CPU seconds move by a fifth."""

ETCD_COUNTED = {
    "grpc_server_handled_total": "grpc_method",
    "grpc_server_started_total": "grpc_method",
    "grpc_server_msg_sent_total": "grpc_method",
    "grpc_server_msg_received_total": "grpc_method",
    "etcd_debugging_mvcc_events_total": "",
    "etcd_network_client_grpc_received_bytes_total": "",
    "etcd_network_client_grpc_sent_bytes_total": "",
    "etcd_disk_backend_commit_duration_seconds_count": "",
    **dict.fromkeys(GO_RUNTIME_COUNTED, ""),
}
"""etcd's own counts: its calls by gRPC method, the bytes it took in and sent out, and how
often it committed its store (the fewer per pod, the more writes each commit took; its log
is not synced to disk here: the harness runs it with --unsafe-no-fsync)."""


async def server_requests(api: client.ApiClient, etcd: str) -> Counter[str]:
    """The apiserver's requests so far by verb and resource (`apiserver_request_total`), its
    own requests to etcd by operation and resource (`etcd_requests_total`, "etcd ..."), and
    etcd's calls by gRPC method and bytes in and out ("etcd grpc ..."), the benchmark's own
    included: pods created, the stand-in's PATCH and the watches' LISTs; and each server's
    bytes allocated ("apiserver go_...", "etcd go_...")."""
    response = await api.call_api(
        "/metrics", "GET", _preload_content=False, auth_settings=["BearerToken"]
    )
    counts: Counter[str] = Counter()
    counted = (
        "apiserver_request_total",
        "etcd_requests_total",
        "authentication_attempts",
        *GO_RUNTIME_COUNTED,
    )
    for metric, labels, value in counters((await response.read()).decode(), counted):
        if metric in GO_RUNTIME_COUNTED:
            counts[f"apiserver {metric}"] += int(value)
        elif metric == "authentication_attempts":
            counts[f"authenticated {labels.get('result')}"] += int(value)
        elif metric == "etcd_requests_total":
            counts[f"etcd {labels.get('operation')} {labels.get('resource')}"] += int(value)
        elif metric == "apiserver_request_total":
            what = f"{labels.get('verb')} {labels.get('resource')}"
            if labels.get("subresource"):
                what += f"/{labels['subresource']}"
            counts[what] += int(value)
    async with aiohttp.ClientSession() as session, session.get(etcd + "/metrics") as got:
        got.raise_for_status()
        for metric, labels, value in counters(await got.text(), ETCD_COUNTED):
            kind = "etcd" if metric in GO_RUNTIME_COUNTED else "etcd grpc"
            what = f"{kind} {metric} {labels.get(ETCD_COUNTED[metric], '')}".strip()
            counts[what] += int(value)
    return counts


@dataclass(frozen=True)
class Servers:
    """The apiserver and etcd: their CPU per pod is each scheduler's cost on the server."""

    pids: dict[str, int]
    etcd: str
    """etcd's client URL (its metrics, its profiles)."""

    def cpu_seconds(self) -> dict[str, float]:
        return cpu_of(self.pids)

    def total_cpu_seconds(self) -> float:
        return sum(self.cpu_seconds().values())

    def counts(self) -> dict[str, int]:
        """`SERVER_COUNTED` so far."""
        return {
            f"{SERVER_SHORT[name]}_{what}": count
            for name, pid in self.pids.items()
            for what, count in process_counts(pid).items()
        }


PROFILE_CHUNK_S = 5
"""pprof's CPU profile covers a duration given up front; a phase's is taken in chunks this long
(the one under way when the phase ends is dropped) and merged."""
TRACE_AFTER_S, TRACE_S = 2, 3
"""The apiserver's execution trace in a burst: from 2 s in (its creates and binds under way)
for 3 s (a few MiB; `bench/tracewake` reads what woke it and its system calls)."""


class ServerProfiles:
    """CPU profiles of the apiserver and etcd over a phase, each merged into
    `<directory>/<phase>-<server>.pb.gz`, and what each allocated in it,
    `<phase>-<server>-allocs.pb.gz` (read them with `go tool pprof`; a phase's allocations
    against another's with `-sample_index=alloc_space -diff_base`)."""

    def __init__(self, api: client.ApiClient, etcd: str, directory: Path, phase: str) -> None:
        self._api = api
        self._etcd = etcd
        self._directory = directory
        self._phase = phase
        self._chunks: dict[str, list[Path]] = {"kube-apiserver": [], "etcd": []}
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._directory.mkdir(parents=True, exist_ok=True)
        await self._snapshot_allocs("before")
        self._tasks = [asyncio.create_task(self._collect(server)) for server in self._chunks]

    async def trace(self, moment: str) -> None:
        """The apiserver's execution trace (`go tool trace`: each goroutine's runs, waits and
        system calls) over TRACE_S seconds, TRACE_AFTER_S into `moment`, into
        `<directory>/<phase>-kube-apiserver-<moment>.trace`; what went wrong is said on stderr."""
        await asyncio.sleep(TRACE_AFTER_S)
        try:
            async with aiohttp.ClientSession() as session:
                body = await self._fetch("kube-apiserver", session, "trace")
        except (aiohttp.ClientError, client.ApiException, RuntimeError, OSError) as failed:
            print(f"{self._phase}: no trace of the {moment}: {failed!r}", file=sys.stderr)
            return
        out = self._directory / f"{self._phase}-kube-apiserver-{moment}.trace"
        await asyncio.to_thread(out.write_bytes, body)

    def _allocs(self, server: str, when: str) -> Path:
        return self._directory / f"{self._phase}-{server}-allocs-{when}"

    async def _snapshot_allocs(self, when: str) -> None:
        """Each server's allocations so far, into `_allocs(server, when)`."""
        async with aiohttp.ClientSession() as session:
            for server in self._chunks:
                self._allocs(server, when).write_bytes(await self._fetch(server, session, "allocs"))

    async def _fetch(
        self, server: str, session: aiohttp.ClientSession, profile: str = "profile"
    ) -> bytes:
        """A profile of `server`: CPU over the next chunk, its execution trace (`trace`), or its
        allocations since it began (`allocs`: after a collection, for the profile shows them as
        of the last one)."""
        query = f"/debug/pprof/{profile}"
        query += {"profile": f"?seconds={PROFILE_CHUNK_S}", "trace": f"?seconds={TRACE_S}"}.get(
            profile, "?gc=1"
        )
        if server == "etcd":
            async with session.get(self._etcd + query) as answer:
                answer.raise_for_status()
                return await answer.read()
        response = await self._api.call_api(
            query, "GET", _preload_content=False, auth_settings=["BearerToken"]
        )
        body = cast(bytes, await response.read())
        if response.status != 200:
            raise RuntimeError(f"{server} answered {response.status}: {body[:200]!r}")
        return body

    async def _collect(self, server: str) -> None:
        async with aiohttp.ClientSession() as session:
            while True:
                chunk = self._directory / f"{self._phase}-{server}-{len(self._chunks[server])}"
                chunk.write_bytes(await self._fetch(server, session))
                self._chunks[server].append(chunk)

    async def stop(self) -> None:
        """End the phase's profiles and merge each; what went wrong is said on stderr, not
        raised: a profile is an aid, and the phase's own error, if any, is the one to see."""
        for task in self._tasks:
            task.cancel()
        for ended in await asyncio.gather(*self._tasks, return_exceptions=True):
            if not isinstance(ended, asyncio.CancelledError):
                print(f"{self._phase}: a profile stopped early: {ended!r}", file=sys.stderr)
        try:
            await self._snapshot_allocs("after")
        except (aiohttp.ClientError, client.ApiException, RuntimeError, OSError) as failed:
            print(f"{self._phase}: allocations not read: {failed!r}", file=sys.stderr)
        for server in self._chunks:  # what the phase allocated: after less before
            before, after = self._allocs(server, "before"), self._allocs(server, "after")
            if not after.exists():
                continue
            await self._pprof(
                ["-base", str(before), str(after)],
                self._directory / f"{self._phase}-{server}-allocs.pb.gz",
                [before, after],
            )
        for server, chunks in self._chunks.items():
            if not chunks:  # a phase shorter than a chunk
                continue
            await self._pprof(
                list(map(str, chunks)), self._directory / f"{self._phase}-{server}.pb.gz", chunks
            )

    @staticmethod
    async def _pprof(arguments: list[str], out: Path, inputs: list[Path]) -> None:
        """`go tool pprof -proto <arguments>` into `out`; its inputs removed once it is made."""
        with out.open("wb") as written:
            making = await asyncio.create_subprocess_exec(
                "go", "tool", "pprof", "-proto", *arguments, stdout=written
            )
            if await making.wait():
                print(f"go tool pprof could not make {out} of {arguments}", file=sys.stderr)
                return
        for path in inputs:
            path.unlink()


async def backlog_bound(binds: Binds, pid: int, keys: list[str]) -> tuple[float, float]:
    """Pods bound per second from the first bind to the last of `keys` (pods pending before
    the scheduler `pid` started), and its CPU seconds per 1,000 pods over that time."""
    cpu: dict[str, float] = {}

    def sample() -> None:  # CPU at the first and the last bind of the backlog
        seen = sum(1 for k in keys if k in binds.at)
        if seen == 1 or seen == len(keys):
            cpu["first" if seen == 1 else "last"] = cpu_seconds(pid)

    binds.on_bind = sample
    try:
        await binds.wait(keys)
    finally:
        binds.on_bind = None
    times = [binds.at[k] for k in keys]
    rate = (len(keys) - 1) / (max(times) - min(times))
    return rate, (cpu["last"] - cpu["first"]) / (len(keys) - 1) * 1000


async def measure_gangs(
    api: client.ApiClient, binds: Binds, workdir: Path, kubeconfig: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """The operator's backlog of single pods, then of gangs of `--gang-size` (Volcano
    PodGroups, minMember the gang's size), the same number of pods of `--gang-mib` each."""
    core = client.CoreV1Api(api)
    await install_podgroup_crds(api)
    found: dict[str, Any] = {}
    for label, gang_size in (("single", 0), ("gangs", args.gang_size)):
        await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": label}}))
        names = [f"{label}-{i}" for i in range(args.pods)]
        operator = Operator(workdir, kubeconfig, args.operator_env, leader_elect=args.leader_elect)
        await create_pods(
            core,
            label,
            names,
            operator.name,
            shape=args.pod_shape,
            mib=args.gang_mib,
            gang_size=gang_size,
        )
        pid = operator.start()
        try:
            rate, cpu = await backlog_bound(binds, pid, [f"{label}/{n}" for n in names])
        finally:
            operator.stop()
        await empty(core, label)
        found[label] = {"bound_per_s": round(rate), "cpu_s_per_1000_pods": round(cpu, 2)}
        print(f"{label}: {found[label]}", flush=True)
    found["gangs_vs_single"] = round(
        found["gangs"]["bound_per_s"] / found["single"]["bound_per_s"], 2
    )
    return found


# -- raw: Bindings from processes of their own ------------------------------------------


async def raw_bind(kubeconfig: Path, namespace: str, part: int, parts: int, nodes: int) -> None:
    """Binds this part of the namespace's pods; prints its start and end (epoch seconds)."""
    async with await kube.api_client(kubeconfig) as api:
        core = client.CoreV1Api(api)
        listed = await kube.raw_json(core.list_namespaced_pod(namespace, _preload_content=False))
        pods = sorted(listed["items"], key=lambda p: p["metadata"]["name"])[part::parts]
        limit = asyncio.Semaphore(IN_FLIGHT)

        async with KubeSchedulerApi(api, identity="raw", timeout_s=60) as binder:

            async def bind(number: int, body: dict[str, Any]) -> None:
                annotations = {
                    contract.GPU_INDEX: str(number % 8),
                    contract.PREDICATE_TIME: str(time.time_ns()),
                    contract.GPU_ASSIGNED: contract.GPU_ASSIGNED_FALSE,
                }
                async with limit:
                    await binder.bind(pod_ref(body), node_name(number % nodes), annotations)

            started = time.time()
            await asyncio.gather(*(bind(part + i * parts, p) for i, p in enumerate(pods)))
        print(json.dumps({"started": started, "ended": time.time(), "bound": len(pods)}))


async def measure_raw(
    api: client.ApiClient, kubeconfig: Path, args: argparse.Namespace
) -> dict[str, Any]:
    core = client.CoreV1Api(api)
    await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": "raw"}}))
    await create_pods(
        core, "raw", [f"raw-{i}" for i in range(args.pods)], "nobody", shape=args.pod_shape
    )
    argv = [sys.executable, __file__, "--raw-bind", str(kubeconfig), "--nodes", str(args.nodes)]
    processes = [
        await asyncio.create_subprocess_exec(
            *argv, "--part", str(part), stdout=asyncio.subprocess.PIPE
        )
        for part in range(RAW_PROCESSES)
    ]
    reports = [json.loads((await p.communicate())[0]) for p in processes]
    span = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    await empty(core, "raw")
    return {"bound_per_s": round(sum(r["bound"] for r in reports) / span)}


# -- the schedulers --------------------------------------------------------------------


class KubeScheduler:
    """kube-scheduler with a profile of its own, its client limit raised to `qps` (None: its
    default); `leader_elect`: with its Lease as its defaults have it."""

    def __init__(
        self,
        workdir: Path,
        kubeconfig: Path,
        qps: int | None,
        env: Mapping[str, str],
        *,
        leader_elect: bool,
    ) -> None:
        self.label = self.name = "kube-scheduler-raised" if qps else "kube-scheduler-default"
        self._env = {**os.environ, **env}
        self._workdir = workdir
        self._config = workdir / f"{self.name}.yaml"
        connection: dict[str, Any] = {"kubeconfig": str(kubeconfig)}
        if qps:
            connection.update(qps=qps, burst=qps)
        self._config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": connection,
                    "leaderElection": {"leaderElect": leader_elect},
                    "profiles": [{"schedulerName": self.name}],
                }
            )
        )
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> int:
        with (self._workdir / f"{self.name}.log").open("ab") as log:
            self._process = subprocess.Popen(
                [
                    str(ensure_binaries().kube_scheduler),
                    f"--config={self._config}",
                    f"--secure-port={free_port()}",
                    f"--cert-dir={self._workdir / self.name}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env,
            )
        return self._process.pid

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=30)


TIMINGS = {"lease_duration_s", "renew_deadline_s", "retry_period_s", "status_interval_s"}
SHIPPED_TIMINGS = {
    option.env: str(getattr(OperatorConfig(identity="bench"), option.field))
    for option in OPTIONS
    if option.field in TIMINGS
}
"""The operator's Lease and status timings as shipped (the harness's are a test's, for a quick
takeover: a round four times as often, and binds held back after 3 s without a renewal)."""


class Operator:
    label = "operator"
    name = "volcano"

    def __init__(
        self, workdir: Path, kubeconfig: Path, env: Mapping[str, str], *, leader_elect: bool
    ) -> None:
        self._process = OperatorProcess(
            kubeconfig,
            workdir / "operator.log",
            env={"GPUSHARE_LEADER_ELECT": str(leader_elect).lower(), **SHIPPED_TIMINGS, **env},
        )

    def start(self) -> int:
        self._process.start(wait_synced=False)
        return self._process.pid

    def stop(self) -> None:
        self._process.stop()


async def own_identities(
    plane: ControlPlane, core: client.CoreV1Api, workdir: Path
) -> tuple[Path, Path]:
    """Kubeconfigs of each scheduler's own identity, as clusters run them: the operator's
    ServiceAccount token (the shipped roles, policies and FlowSchema applied, as an admin
    applies them: its calls in kube-scheduler's API Priority and Fairness level),
    and kube-scheduler's client certificate for `system:kube-scheduler` (its roles are the
    apiserver's bootstrap ones; kubeadm's scheduler.conf is such a certificate). The server
    authenticates and authorizes each scheduler's requests as it would in a cluster: a
    token from its cache, a certificate verified on every request; RBAC for both."""
    assert plane.pki is not None
    await install_roles(plane.binaries.kubectl, plane.kubeconfig)
    await asyncio.to_thread(
        subprocess.run,
        [str(plane.binaries.kubectl), "--kubeconfig", str(plane.kubeconfig), "apply", "-f",
         str(FLOW_SCHEMA)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    operator = await operator_kubeconfig(core, plane.kubeconfig, workdir / "operator.kubeconfig")
    cert, key = plane.pki.issue(workdir / "kube-scheduler", "system:kube-scheduler")
    scheduler = workdir / "kube-scheduler.kubeconfig"
    plane.write_kubeconfig(
        scheduler,
        "system:kube-scheduler",
        {"client-certificate": str(cert), "client-key": str(key)},
    )
    return operator, scheduler


def node_name(number: int) -> str:
    return f"node-{number:04d}"


async def create_nodes(core: client.CoreV1Api, nodes: int, cards: int) -> None:
    limit = asyncio.Semaphore(16)

    async def node(number: int) -> None:
        async with limit:
            await create_gpu_node(
                core,
                FakeGpuNode(name=node_name(number), gpu_memory=cards * CARD_MIB, gpu_number=cards),
            )

    await asyncio.gather(*(node(n) for n in range(nodes)))


def start_plane(args: argparse.Namespace, workdir: Path) -> ControlPlane:
    """With `--server-cpus`, the apiserver and etcd on those CPUs and everything else on the
    others, so that a scheduler's own CPU takes none of theirs."""
    everyone = os.sched_getaffinity(0)
    if args.server_cpus:
        os.sched_setaffinity(0, args.server_cpus)  # the control plane inherits it
    try:
        return ControlPlane(
            workdir / "plane", profiling=args.profile is not None, compaction_interval_s=0
        ).start()
    finally:
        if args.server_cpus:
            # This process and all it starts later (schedulers, stand-in, raw binders). Each
            # Go program sizes GOMAXPROCS to its CPUs: 1 for every one of them on 2 cores.
            os.sched_setaffinity(0, everyone - args.server_cpus)


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    plane = start_plane(args, workdir)
    assert plane.endpoints is not None
    servers = Servers(
        {name: plane.pids()[name] for name in ("kube-apiserver", "etcd")}, plane.endpoints.etcd
    )
    stand_in: asyncio.subprocess.Process | None = None
    try:
        async with await kube.api_client(plane.kubeconfig) as api:
            core = client.CoreV1Api(api)
            await install_crds(api)
            await core.create_namespace(
                cast(client.V1Namespace, {"metadata": {"name": "gpushare-system"}})
            )
            await create_nodes(core, args.nodes, args.cards)
            as_operator, as_kube_scheduler = await own_identities(plane, core, workdir)
            binds = Binds()
            ready = asyncio.Event(), asyncio.Event()
            binds.watches = watchers = [
                asyncio.create_task(binds.watch(api, ready[0])),
                asyncio.create_task(binds.watch_events(api, ready[1])),
            ]
            await asyncio.gather(*(r.wait() for r in ready))
            if args.gang_size:
                stand_in = await asyncio.create_subprocess_exec(
                    sys.executable, __file__, "--stand-in", str(plane.kubeconfig)
                )
                return await measure_gangs(api, binds, workdir, as_operator, args)
            results: dict[str, Any] = {"raw": await measure_raw(api, plane.kubeconfig, args)}
            print(f"raw: {results['raw']}", flush=True)
            stand_in = await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--stand-in",
                str(plane.kubeconfig),
                *(["--same-pods"] if args.same_pods else []),
            )
            load = {"benchmark": os.getpid(), "stand_in": stand_in.pid}
            raised = KubeScheduler(
                workdir,
                as_kube_scheduler,
                KUBE_SCHEDULER_RAISED_QPS,
                args.kube_scheduler_env,
                leader_elect=args.leader_elect,
            )
            operator = Operator(
                workdir, as_operator, args.operator_env, leader_elect=args.leader_elect
            )
            rounds: list[dict[str, dict[str, Any]]] = []
            profiles = (
                functools.partial(ServerProfiles, api, servers.etcd, args.profile)
                if args.profile
                else None
            )
            for number in range(args.rounds):
                # Each goes first in every other round: neither gains from the cluster's drift.
                pair: list[Scheduler] = (
                    [raised, operator] if number % 2 == 0 else [operator, raised]
                )
                measured = {}
                for scheduler in pair:
                    namespace = f"{scheduler.label}-{number}"
                    measured[scheduler.label] = await measure(
                        api,
                        binds,
                        scheduler,
                        args,
                        namespace,
                        servers=servers,
                        load=load,
                        profiles=profiles,
                    )
                    print(f"round {number}, {scheduler.label}: {measured[scheduler.label]}")
                rounds.append(measured)
            default = KubeScheduler(
                workdir,
                as_kube_scheduler,
                None,
                args.kube_scheduler_env,
                leader_elect=args.leader_elect,
            )
            results[default.label] = await measure(
                api, binds, default, args, default.label, servers=servers, load=load
            )
            print(f"{default.label}: {results[default.label]}", flush=True)
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
    finally:
        if stand_in is not None and stand_in.returncode is None:
            stand_in.terminate()
            await stand_in.wait()
        plane.stop()
    compared = (
        "backlog_bound_per_s",
        "burst_bound_per_s",
        "backlog_cpu_s_per_1000_pods",
        "backlog_server_cpu_s_per_1000_pods",
        "burst_server_cpu_s_per_1000_pods",
        "server_cpu_s_per_1000_pods",
        "apiserver_cpu_s_per_1000_pods",
        "etcd_cpu_s_per_1000_pods",
        *(f"{phase}{what}_per_pod" for phase in ("", "burst_") for what in SERVER_COUNTED),
    )
    per_round = {
        key: [ratio(r["operator"][key], r["kube-scheduler-raised"][key]) for r in rounds]
        for key in compared
    }
    for label in ("kube-scheduler-raised", "operator"):
        results[label] = median_round([r[label] for r in rounds])
    results["operator_vs_kube_scheduler"] = {
        key: median_known(ratios) for key, ratios in per_round.items()
    }
    results["operator_vs_kube_scheduler_per_round"] = per_round
    ours = results["operator"]
    results["operator_backlog_vs_raw"] = round(
        ours["backlog_bound_per_s"] / results["raw"]["bound_per_s"], 2
    )
    order = ("raw", "kube-scheduler-raised", "kube-scheduler-default", "operator")
    return {key: results[key] for key in order} | results


async def stand_in(kubeconfig: Path, *, same_pods: bool) -> None:
    async with await kube.api_client(kubeconfig, connections=STAND_IN_IN_FLIGHT) as api:
        await act_as_device_plugins(
            api,
            every_bound_pod=True,
            placement_record=same_pods,
            in_flight=STAND_IN_IN_FLIGHT,
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--single", type=int, default=50, help="pods created one at a time")
    parser.add_argument(
        "--rounds",
        type=positive,
        default=5,
        help="kube-scheduler (raised) and the operator, this many times each, taking turns",
    )
    parser.add_argument(
        "--gang-size",
        type=int,
        default=0,
        help="instead: the operator alone, single pods against gangs of this many (PodGroups)",
    )
    parser.add_argument("--gang-mib", type=int, default=8192, help="each gang member's MiB")
    add_shape_argument(parser, default="minimal", pods="the pods")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--kube-scheduler-env",
        type=env_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in kube-scheduler's environment only (e.g. DISABLE_HTTP2=true: client-go "
        "then speaks HTTP/1.1)",
    )
    parser.add_argument(
        "--operator-env",
        type=env_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in the operator's environment only, over the shipped timings (e.g. "
        "GPUSHARE_MAX_CONCURRENT_BINDS=32)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="write the apiserver's and etcd's CPU profile of each round's phases here, and what "
        "each allocated in them",
    )
    parser.add_argument(
        "--server-cpus",
        type=cpu_list,
        help="run the apiserver and etcd on these CPUs (e.g. 0), everything else on the others",
    )
    parser.add_argument(
        "--leader-elect",
        action="store_true",
        help="both schedulers elect a leader by their Lease, as clusters run them (the operator's "
        "Bindings then carry its term, which the leader fence checks)",
    )
    parser.add_argument(
        "--same-pods",
        action="store_true",
        help="kube-scheduler's pods end as the operator's do: the stand-in's write gives them "
        "Volcano's gpu-index and predicate-time too (the record a GPU-sharing scheduler leaves)",
    )
    parser.add_argument("--raw-bind", type=Path, help=argparse.SUPPRESS)  # a raw-bind process
    parser.add_argument("--part", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--stand-in", type=Path, help=argparse.SUPPRESS)  # the plugins' stand-in
    args = parser.parse_args()
    args.kube_scheduler_env = dict(args.kube_scheduler_env)
    args.operator_env = dict(args.operator_env)
    if args.profile and shutil.which("go") is None:
        parser.error("--profile needs go on PATH: `go tool pprof` merges each phase's profiles")
    if args.raw_bind:
        asyncio.run(raw_bind(args.raw_bind, "raw", args.part, RAW_PROCESSES, args.nodes))
        return 0
    if args.stand_in:
        asyncio.run(stand_in(args.stand_in, same_pods=args.same_pods))
        return 0
    cores = len(os.sched_getaffinity(0))
    machine = f"{platform.machine()}, {platform.python_version()}, {cores} cores " + (
        f"(the apiserver and etcd on CPUs {sorted(args.server_cpus)}, the rest on the others)"
        if args.server_cpus
        else "shared by all"
    )
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as workdir:
        results = asyncio.run(run(args, Path(workdir)))
    print(f"{args.nodes} nodes x {args.cards} cards, {args.pods} pods; {machine}")
    for key, value in results.items():
        print(f"  {key:<26} {value}")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"machine": machine, "args": vars(args), "results": results},
                indent=2,
                default=lambda value: sorted(value) if isinstance(value, set) else str(value),
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
