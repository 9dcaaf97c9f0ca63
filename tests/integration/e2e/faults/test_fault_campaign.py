"""The fault campaign: 1,000 pods over 50 GPU nodes (each with the device plugin and the
kubelet's device manager), created in waves while things break, then every pod accounted for.
Pods are created (and some deleted) by a tenant with `edit` in the namespace, through the
admission chain (the operators' webhook, which both replicas serve, and the policies), in MiB
as users write them.

The two operator replicas' clocks differ (the second runs ahead, by an amount the seed picks).
Each fault fires during a wave, once work is in flight (observed: a pod bound since the last
look, while pods bound are not yet started; a node's fault on a node with such pods, so its
Allocates are in flight): the operator leader SIGKILLed (a takeover asserted each time),
the leader paused past its Lease (split brain: the standby's takeover asserted, then the old
leader's step down), the apiserver restarted and stalled (SIGSTOP: every watch and call
hangs), etcd stopped and slowed, device plugins and kubelets restarted with Allocates in
flight, a plugin cut off from the apiserver (each plugin reaches it through a relay of the
test's), a plugin's connections gone silent (half-open, its watch among them), an XID on a
card, a node with pods on it deleted (its pods go, as the pod garbage collector would remove
them), the admission webhook unreachable, the components' writes answered 500 (half of them:
a webhook of the test's refuses them), and pods deleted while they are being bound.
The order of the faults, their targets and the pods come from one seed, chosen at random for
each run and printed (`GPUSHARE_FAULT_SEED=<seed>` replays it).

Afterwards, every pod is accounted for:
- Running with the env of its grant (the card of its `gpu-index`, the MiB it asked), as the
  kubelet started it; or refused by its kubelet, each refusal explained by a fault fired on
  its node (or on the whole cluster) just before; or Unschedulable with a FailedScheduling
  event, where the model, replayed on the final state, finds no room for it; or refused at
  creation as not admitted, while no webhook replica could answer (a fault just before);
- no card holds more than it has, counted from what the containers were given; no whole card
  is shared; no card's record differs from its GPUNode status; no bound pod keeps a stale
  PodScheduled=False; every pod on a node was bound by the operator's Binding, as the
  apiserver's audit log records, in a Lease term, and none after a later term began (the
  operators' logs claim no other Binding);
- exactly one operator leads, and holds the Lease; no component was refused a right.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import os
import random
import re
import shutil
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
import yaml
from admitting import NOT_ADMITTED, ready
from failure_logs import print_logs_now
from kubernetes_asyncio import client

from gpushare.kube import ApiError, raw_json
from gpushare.kube.reflector import WATCH_IDLE_S
from gpushare.model import contract
from gpushare.model.annotations import gpu_assigned, parse_card_indices
from gpushare.model.bound import kubelet_order
from gpushare.model.inventory import NodeInventory, node_inventory
from gpushare.model.placement import find_placement
from gpushare.model.request import GpuKind, gpu_request
from gpushare.model.usage import Allocation, Ledger, check_allocation, claim_of
from gpushare_harness import ControlPlane, FakeGpuNode, create_gpu_node
from gpushare_harness.controlplane import free_port
from gpushare_harness.crds import install_admission
from gpushare_harness.failing_webhook import MESSAGE as INJECTED
from gpushare_harness.failing_webhook import FailingWebhook
from gpushare_harness.identities import (
    OPERATOR,
    PLUGIN,
    operator_kubeconfig,
    plugin_kubeconfig,
)
from gpushare_harness.kubelet import KubeletHarness
from gpushare_harness.operator import OperatorProcess, webhook_url
from gpushare_harness.plugin import PluginProcess
from gpushare_harness.process import LoggedProcess
from gpushare_harness.relay import Relay, through

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(900)]

NODES = 50
PODS = 1000
CARDS = 8
CARD = 11178
SEED = int(os.environ.get("GPUSHARE_FAULT_SEED") or random.SystemRandom().randrange(1, 10**6))
# 64 MiB per device (174 per card): at 1 MiB a node lists 89,424 devices, and the kubelet's
# device manager (1.36, ResourceHealthStatus on by default) then spends minutes holding its
# lock after a restart, comparing every device with every allocation
# (podDevices.getPodAndContainerForDevice builds a set per container per device): a kubelet
# restart on a busy 1 MiB node stalls admission for minutes. See the README's limits.
UNIT_MIB = 64
SIZES = (8, 16, 32, 64)  # units: 512 MiB to 4 GiB
TOO_BIG = str(313 * UNIT_MIB)  # 20,032 MiB: more than any card
LEASE_S = 4.0  # the harness's operators' Lease (OperatorProcess)
TAKEOVER_S = LEASE_S + 20  # the Lease runs out, then a standby's next round on a busy machine
# A kubelet refusal is explained by a fault that ended at most this long before it: the
# plugin's watch grace (--allocate-wait-seconds, 5 s) and the kubelet's own reconnects.
REFUSAL_GRACE_S = 15.0
PARTITION_S = 6.0
CLOCK_SKEWS_S = (45, 300)  # the second replica's clock runs ahead: by about a Lease, or far
TOP_UP = 8  # pods created when a wave went through before its fault saw work in flight
# Faults that leave the apiserver no webhook answer to a pod's creation for a moment (each
# replica's connections end with it; a paused replica answers nothing within the webhook's
# 5 s; a paused apiserver finds its calls past their deadline when it resumes): the GPU pods
# created then are refused as not admitted, as docs/admission.md says.
WEBHOOK_FAULTS = (
    "admission webhook down",
    "leader killed",
    "leader paused past its Lease",
    "apiserver stalled",
)
INTERNAL_ERRORS_SHARE = 0.5
# How long a Binding of the term before may land after the next term's leader logged that it
# leads: it leads only once the apiserver refuses that term (it checks with a dry run), so this
# is the log's timestamp against the audit log's, with margin.
LEASE_CACHE_LAG_S = 1.0


def _labelled_in(meta: dict[str, Any], term: str) -> bool:
    """Whether the pod's labels name the term its annotation names (the transitions that both
    spell; the label adds the Lease's uid)."""
    label = (meta.get("labels") or {}).get(contract.LEASE_TERM_LABEL, "")
    return bool(term) and label.partition(".")[0] == term.rpartition("/")[2]


class FakeNode:
    def __init__(
        self, name: str, plane: ControlPlane, folder: Path, logs: Path, plugin_kubeconfig: Path
    ) -> None:
        self.name = name
        self.cards = logs / f"{name}-cards.yaml"
        self.cards.write_text(yaml.safe_dump({"cards": [{"memoryMiB": CARD}] * CARDS}))
        folder = folder / "device-plugins"  # its kubelet's pod-resources socket beside it
        self.kubelet = KubeletHarness(
            node=name,
            kubeconfig=plane.kubeconfig,
            plugin_dir=folder,
            log=logs / f"{name}-kubelet.log",
        )
        self.plugin = PluginProcess(
            node=name,
            kubeconfig=plugin_kubeconfig,
            socket_dir=folder,
            fake_gpus=f"@{self.cards}",
            log=logs / f"{name}-plugin.log",
            args=[f"--gpu-memory-factor={UNIT_MIB}"],
        )


@dataclass(frozen=True)
class Fired:
    """A fault as it happened: when (unix seconds) and where (None: the whole cluster)."""

    name: str
    start: float
    end: float
    nodes: frozenset[str] | None
    causes_refusals: bool


def manifest(number: int) -> dict[str, Any]:
    rng = random.Random(f"{SEED}/pod/{number}")  # the same pod for a seed, whatever the timing
    roll = rng.random()
    limits: dict[str, str]
    if roll < 0.08:
        limits = {contract.GPU_NUMBER: str(rng.choice((1, 2)))}
    elif roll < 0.12:
        limits = {contract.GPU_MEMORY: TOO_BIG}  # larger than any card: Unschedulable
    else:
        limits = {contract.GPU_MEMORY: str(rng.choice(SIZES) * UNIT_MIB)}  # MiB
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"burst-{number:04d}"},
        "spec": {
            "schedulerName": "volcano",
            "containers": [{"name": "c", "image": "busybox", "resources": {"limits": limits}}],
        },
    }


async def retrying(call: Callable[[], Any], *, attempts: int = 60, missing_ok: bool = False) -> Any:
    """An API call that rides out the apiserver restart and etcd's pauses (a refusal for
    good still fails, after the attempts)."""
    for attempt in range(attempts):
        try:
            return await call()
        except (aiohttp.ClientError, OSError, ApiError) as error:
            if isinstance(error, ApiError) and error.status == 404 and missing_ok:
                return None
            # 403 too: an apiserver just restarted refuses until its RBAC caches are filled.
            if isinstance(error, ApiError) and error.status not in (403, 429, 500, 503, 504):
                raise
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.5)
    return None


def stamp(text: object) -> float:
    """A log line's time (unix seconds); Go's nanoseconds cut to Python's microseconds."""
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", str(text))
    return datetime.datetime.fromisoformat(trimmed).timestamp()


def logged_at(process: LoggedProcess, event: dict[str, Any]) -> float:
    """When `process` logged `event`, on the test's clock (a replica's may be skewed)."""
    return stamp(event["timestamp"]) - process.clock_skew_s


def leading_since(operator: OperatorProcess) -> float | None:
    """When the operator's current process began leading; None when it does not lead."""
    if not operator.running:
        return None
    transitions = [
        e
        for e in operator.log_events()[operator.log_start :]
        if e.get("event") in ("started_leading", "stopped_leading")
    ]
    if transitions and transitions[-1]["event"] == "started_leading":
        return logged_at(operator, transitions[-1])
    return None


async def test_a_burst_through_crashes_restarts_and_deletions_accounts_for_every_pod(
    plane: ControlPlane,
    api: client.ApiClient,
    core: client.CoreV1Api,
    tenant: client.CoreV1Api,
    tmp_path: Path,
) -> None:
    print(f"fault campaign seed {SEED}: GPUSHARE_FAULT_SEED={SEED} replays it")
    rng = random.Random(SEED)  # the faults' order and targets
    folders = Path(tempfile.mkdtemp(prefix="dp-faults-"))
    names = [f"gpu-{i:02d}" for i in range(NODES)]
    await asyncio.gather(
        *(create_gpu_node(core, FakeGpuNode(name=n, gpu_memory=0, gpu_number=0)) for n in names)
    )
    # Each component on its own identity: the plugins' tokens bound to their Nodes.
    plugin_configs = await asyncio.gather(
        *(plugin_kubeconfig(core, plane.kubeconfig, n, tmp_path / f"{n}.kubeconfig") for n in names)
    )
    apiserver = yaml.safe_load(plane.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    relays = {name: Relay(int(apiserver.rsplit(":", 1)[1])) for name in names}
    nodes = [
        FakeNode(name, plane, folders / name, tmp_path, through(config, await relays[name].start()))
        for name, config in zip(names, plugin_configs, strict=True)
    ]
    by_name = {node.name: node for node in nodes}
    operator_config = await operator_kubeconfig(core, plane.kubeconfig, tmp_path / "op.kubeconfig")
    # Both replicas serve the webhook on one port (SO_REUSEPORT, as behind a Service); the
    # apiserver reaches it through a relay of the test's, to take it away.
    webhook_port = free_port()
    webhook_relay = Relay(webhook_port)
    await install_admission(api, webhook_url(await webhook_relay.start()))
    internal_errors = FailingWebhook(
        [f"system:serviceaccount:{ns}:{name}" for ns, name in (OPERATOR, PLUGIN)],
        share=INTERNAL_ERRORS_SHARE,
        seed=f"{SEED}/500",
    )
    await internal_errors.start()
    # The second replica's clock runs ahead, as on a machine whose clock drifted: leadership
    # must pass between the two on the Lease's own terms, whatever their clocks say.
    skew = random.Random(f"{SEED}/skew").choice(CLOCK_SKEWS_S)
    operators = [
        OperatorProcess(
            operator_config,
            tmp_path / f"op-{n}.log",
            identity=f"op-{n}",
            clock_skew_s=skew_s,
            webhook_port=webhook_port,
            env={"GPUSHARE_MEMORY_UNIT_MIB": str(UNIT_MIB)},
        )
        for n, skew_s in (("a", 0), ("b", skew))
    ]
    paused: list[int] = []  # pids SIGSTOPped, resumed whatever happens
    fired: list[Fired] = []
    try:
        for node in nodes:
            node.kubelet.start()
            node.plugin.start(wait_registered=False)
        await asyncio.gather(
            *(asyncio.to_thread(n.plugin.wait_registered, timeout_s=180) for n in nodes)
        )
        for operator in operators:
            operator.start(wait_synced=False)
        await asyncio.to_thread(operators[0].wait_logged, "synced", timeout_s=60)
        await ready(core)

        created: list[str] = []
        not_admitted: dict[str, float] = {}  # pod: when its creation was refused
        deleted: set[str] = set()
        gone_nodes: set[str] = set()
        paused_leaders: list[tuple[OperatorProcess, float, float]] = []  # who, from, until
        faults_done = asyncio.Event()

        numbers = itertools.count()

        async def create(count: int) -> None:
            limit = asyncio.Semaphore(16)

            async def one(number: int) -> None:
                body = manifest(number)
                async with limit:
                    try:
                        await retrying(
                            lambda: raw_json(
                                tenant.create_namespaced_pod(
                                    "default", cast(client.V1Pod, body), _preload_content=False
                                )
                            )
                        )
                    except ApiError as error:
                        if NOT_ADMITTED not in error.message:
                            raise
                        not_admitted[body["metadata"]["name"]] = time.time()
                        return
                created.append(body["metadata"]["name"])

            await asyncio.gather(*(one(n) for n in itertools.islice(numbers, count)))

        async def in_flight(fault: str) -> list[str]:
            """Wait until binds and Allocates are in flight: a pod bound since the last look,
            while pods bound are not yet started; their nodes. A wave that went through
            unseen is topped up with a few pods."""
            seen: set[str] | None = None
            quiet_since = time.monotonic()
            for _ in range(300):
                starting = await list_pods(core, field="spec.nodeName!=,status.phase=Pending")
                bound = {p["metadata"]["name"] for p in starting}
                if seen is not None and bound - seen:
                    return sorted({p["spec"]["nodeName"] for p in starting} - gone_nodes)
                seen = bound
                if time.monotonic() - quiet_since > 3:
                    await create(TOP_UP)
                    quiet_since = time.monotonic()
                await asyncio.sleep(0.2)
            raise AssertionError(f"seed {SEED}: no bind or Allocate in flight for {fault}")

        async def fire(
            fault: str,
            action: Callable[[list[str]], Awaitable[frozenset[str] | None]],
            *,
            causes_refusals: bool,
        ) -> None:
            targets = await in_flight(fault)
            start = time.time()
            where = await action(targets)
            fired.append(Fired(fault, start, time.time(), where, causes_refusals))
            print(f"{fault}: {time.time() - start:.1f} s, nodes {sorted(where or ['all'])}")

        async def wait_leader(after: float, *, not_pid: int | None = None) -> OperatorProcess:
            """The operator that began leading after `after` (unix seconds): a takeover."""
            deadline = time.monotonic() + TAKEOVER_S
            while time.monotonic() < deadline:
                for operator in operators:
                    since = leading_since(operator)
                    if since is not None and since > after and operator.pid != not_pid:
                        return operator
                await asyncio.sleep(0.3)
            raise AssertionError(f"seed {SEED}: no takeover within {TAKEOVER_S} s of {after}")

        async def current_leader() -> OperatorProcess:
            return await wait_leader(0)

        async def kill_leader(_: list[str]) -> None:
            victim = await current_leader()
            killed = time.time()
            victim.kill()
            await asyncio.sleep(1)
            victim.start(wait_synced=False)
            await wait_leader(killed)

        async def split_brain(_: list[str]) -> None:
            """The leader paused past its Lease: the standby takes over; the old leader,
            resumed, steps down (and binds nothing meanwhile: the invariants)."""
            victim = await current_leader()
            stopped = time.time()
            os.kill(victim.pid, signal.SIGSTOP)
            paused.append(victim.pid)
            try:
                await wait_leader(stopped, not_pid=victim.pid)
            finally:
                os.kill(victim.pid, signal.SIGCONT)
                paused.remove(victim.pid)
            await asyncio.to_thread(
                victim.wait_logged,
                "stopped_leading",
                timeout_s=TAKEOVER_S,
                match=lambda e: logged_at(victim, e) > stopped,
            )
            paused_leaders.append((victim, stopped, time.time()))

        async def restart_apiserver(_: list[str]) -> None:
            await asyncio.to_thread(plane.restart_apiserver)

        async def pause_etcd(seconds: float, slices: int) -> None:
            etcd = plane.pids()["etcd"]
            for _ in range(slices):
                os.kill(etcd, signal.SIGSTOP)
                paused.append(etcd)
                try:
                    await asyncio.sleep(seconds / slices / 2 if slices > 1 else seconds)
                finally:
                    os.kill(etcd, signal.SIGCONT)
                    paused.remove(etcd)
                if slices > 1:
                    await asyncio.sleep(seconds / slices / 2)

        async def stop_etcd(_: list[str]) -> None:
            await pause_etcd(3, 1)

        async def slow_etcd(_: list[str]) -> None:
            await pause_etcd(4, 10)  # 0.2 s stopped, 0.2 s running

        def pick(targets: list[str]) -> FakeNode:
            return by_name[rng.choice(targets)]

        async def restart_plugin(targets: list[str]) -> frozenset[str]:
            node = pick(targets)
            node.plugin.kill()
            node.plugin.start(wait_registered=False)
            await asyncio.to_thread(node.plugin.wait_registered, timeout_s=60)
            return frozenset({node.name})

        async def restart_kubelet(targets: list[str]) -> frozenset[str]:
            node = pick(targets)
            await asyncio.to_thread(node.kubelet.restart)
            return frozenset({node.name})

        async def xid(targets: list[str]) -> frozenset[str]:
            node = pick(targets)
            cards: list[dict[str, Any]] = [{"memoryMiB": CARD} for _ in range(CARDS)]
            cards[rng.randrange(CARDS)]["xid"] = 79  # fallen off the bus: Unhealthy
            node.cards.write_text(yaml.safe_dump({"cards": cards}))
            return frozenset({node.name})

        async def partition(targets: list[str]) -> frozenset[str]:
            """A node's plugin cut off from the apiserver for a while (its kubelet is not)."""
            node = pick(targets)
            relays[node.name].sever()
            await asyncio.sleep(PARTITION_S)
            relays[node.name].heal()
            return frozenset({node.name})

        async def quiet_watch(targets: list[str]) -> frozenset[str]:
            """A node's plugin's connections, its pod watch and pooled ones among them, go
            silent for good (half-open, as behind a stuck proxy): the plugin is blind until a
            LIST gets through on a new connection (a late watch lists again at each Allocate,
            giving up the LIST before, and a watch or LIST silent too long is given up)."""
            node = pick(targets)
            # Just after a fault of its own (cut off, restarted) the plugin may hold no
            # connection yet: it opens one on its next retry.
            for _ in range(300):
                if relays[node.name].stall():
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError((SEED, node.name, "no connection to stall in 30 s"))
            seen = len(node.plugin.log_events())
            # Blind until its pods are listed again (an Allocate late by half the grace asks
            # for it) or its watch, silent for WATCH_IDLE_S, is given up and opened anew.
            await asyncio.to_thread(
                node.plugin.wait_logged,
                ("pods on node listed", "watch_failed"),
                after=seen,
                timeout_s=WATCH_IDLE_S + 30,
            )
            return frozenset({node.name})

        async def pause_apiserver(_: list[str]) -> None:
            """Every watch and call stalls, nothing is closed: a stalled control plane."""
            apiserver = plane.pids()["kube-apiserver"]
            os.kill(apiserver, signal.SIGSTOP)
            paused.append(apiserver)
            try:
                await asyncio.sleep(PARTITION_S)
            finally:
                os.kill(apiserver, signal.SIGCONT)
                paused.remove(apiserver)

        async def throttle(_: list[str]) -> None:
            """The apiserver's own flow control answers the components 429 beyond 1 share of
            its concurrency (a PriorityLevel that rejects, for their ServiceAccounts)."""
            flow = client.FlowcontrolApiserverV1Api(api)
            level = cast(client.V1PriorityLevelConfiguration, THROTTLE_LEVEL)
            flows = cast(client.V1FlowSchema, THROTTLE_FLOWS)
            name = THROTTLE_LEVEL["metadata"]["name"]
            await raw_json(flow.create_priority_level_configuration(level, _preload_content=False))
            await raw_json(flow.create_flow_schema(flows, _preload_content=False))
            try:
                await asyncio.sleep(THROTTLE_S)
            finally:
                await retrying(
                    lambda: raw_json(flow.delete_flow_schema(name, _preload_content=False))
                )
                await retrying(
                    lambda: raw_json(
                        flow.delete_priority_level_configuration(name, _preload_content=False)
                    )
                )

        async def webhook_down(_: list[str]) -> None:
            """No replica of the webhook reachable (its Service without endpoints)."""
            webhook_relay.sever()
            await asyncio.sleep(PARTITION_S)
            webhook_relay.heal()

        async def answer_500(_: list[str]) -> None:
            """Half the components' writes (Bindings, marks, statuses, Events, the Lease)
            answered 500 Internal Server Error."""
            await internal_errors.install(api)
            try:
                await asyncio.sleep(PARTITION_S)
            finally:
                await retrying(lambda: internal_errors.remove(api), missing_ok=True)

        async def delete_node(targets: list[str]) -> frozenset[str]:
            node = pick(targets)
            node.plugin.stop()
            node.kubelet.stop()
            gone_nodes.add(node.name)
            await retrying(lambda: raw_json(core.delete_node(node.name, _preload_content=False)))
            await retrying(
                lambda: raw_json(
                    core.delete_collection_namespaced_pod(
                        "default",
                        field_selector=f"spec.nodeName={node.name}",
                        grace_period_seconds=0,
                        _preload_content=False,
                    )
                )
            )
            return frozenset({node.name})

        async def faults() -> None:
            mix: list[tuple[str, Callable[[list[str]], Awaitable[frozenset[str] | None]], bool]]
            mix = [
                ("leader killed", kill_leader, False),
                ("leader killed", kill_leader, False),
                ("leader paused past its Lease", split_brain, False),
                ("apiserver restarted", restart_apiserver, True),
                ("etcd stopped", stop_etcd, True),
                ("etcd slowed", slow_etcd, True),
                ("plugin restarted", restart_plugin, True),
                ("plugin restarted", restart_plugin, True),
                ("kubelet restarted", restart_kubelet, True),
                ("kubelet restarted", restart_kubelet, True),
                (XID, xid, True),
                ("plugin cut off from the apiserver", partition, True),
                ("plugin's connections gone quiet", quiet_watch, True),
                ("apiserver stalled", pause_apiserver, True),
                ("components answered 429", throttle, True),
                ("components answered 500", answer_500, True),
                ("admission webhook down", webhook_down, False),
                ("node deleted", delete_node, True),
            ]
            rng.shuffle(mix)
            wave = PODS // (len(mix) + 1)
            try:
                for name, action, refusals in mix:
                    creating = asyncio.create_task(create(wave))
                    try:
                        await fire(name, action, causes_refusals=refusals)
                    finally:
                        await creating  # the wave ends before any teardown
            finally:
                faults_done.set()
            await create(max(0, PODS - len(created)))

        async def delete_while_binding() -> None:
            """The newest pod, most likely still being placed or bound, is deleted."""
            pauses = random.Random(f"{SEED}/deletions")
            while not faults_done.is_set():
                await asyncio.sleep(pauses.uniform(0.5, 2.0))
                fresh = [n for n in created[-5:] if n not in deleted]
                if not fresh:
                    continue
                deleted.add(fresh[-1])
                await retrying(
                    lambda n=fresh[-1]: raw_json(  # type: ignore[misc]
                        tenant.delete_namespaced_pod(
                            n, "default", grace_period_seconds=0, _preload_content=False
                        )
                    ),
                    missing_ok=True,
                )

        await asyncio.gather(faults(), delete_while_binding())
        await settle(core, operators, deadline_s=240, gone_nodes=gone_nodes)
        await check_invariants(
            core, api, nodes, operators, fired=fired, gone_nodes=gone_nodes, deleted=deleted
        )
        check_bound_by_the_leader(plane, operators, await list_pods(core))
        check_not_admitted(not_admitted, fired)
        print("writes answered 500 by the test's webhook:", dict(internal_errors.answered))
        if any(f.name == "components answered 500" for f in fired):
            assert internal_errors.answered["refused"], (SEED, "no write was answered 500")
        await check_one_leader(api, operators)
        # Every right a component uses is in its role. Two refusals are expected: an
        # apiserver starting answers before its RBAC caches are filled (forbidden for a
        # moment, with "clusterrole ... not found"), so refusals while it restarts are not
        # counted; and a leader paused between its own fence's check and the send has its
        # Bindings refused on resume by the apiserver's fence (the policy, "term that is
        # over"): the fence working, not counted for that leader's own term while the fault
        # lasts (a write any other replica sent in an old term still is).
        restarts = [f for f in fired if f.name == "apiserver restarted"]

        def expected(process: LoggedProcess, event: dict[str, Any]) -> bool:
            at = logged_at(process, event)
            if any(f.start <= at <= f.end + RBAC_WARM_UP_S for f in restarts):
                return True
            text = json.dumps(event)
            sent_in = text.split(contract.TERM_OVER, 1)[-1].split("; the Lease names", 1)[0]
            return contract.TERM_OVER in text and any(
                process is leader
                and f"/{leader.identity}/" in sent_in
                and start <= at <= end + FENCE_LOGGED_S
                for leader, start, end in paused_leaders
            )

        for process in [*operators, *(node.plugin for node in nodes)]:
            refused = [
                event
                for event in process.log_events()
                if "is forbidden" in json.dumps(event) and not expected(process, event)
            ]
            assert not refused, f"seed {SEED}: {process.name} refused: {refused[:3]}"
    except BaseException:
        print(f"seed {SEED}: faults fired: {fired}")  # CI keeps only the run's output
        print_logs_now(operators)
        raise
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        for relay in [*relays.values(), webhook_relay]:
            await relay.close()
        await internal_errors.close()
        for operator in operators:
            operator.stop()
        for node in nodes:
            node.plugin.stop()
            node.kubelet.stop()
        shutil.rmtree(folders, ignore_errors=True)


RBAC_WARM_UP_S = 10.0
FENCE_LOGGED_S = 5.0
"""How long after the paused leader stepped down its refused Bindings may still be logged."""
THROTTLE_S = 6.0
THROTTLE_LEVEL: dict[str, Any] = {
    "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
    "kind": "PriorityLevelConfiguration",
    "metadata": {"name": "campaign-throttle"},
    "spec": {
        "type": "Limited",
        "limited": {
            "nominalConcurrencyShares": 1,
            "lendablePercent": 0,
            "limitResponse": {"type": "Reject"},
        },
    },
}
THROTTLE_FLOWS: dict[str, Any] = {
    "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
    "kind": "FlowSchema",
    "metadata": {"name": "campaign-throttle"},
    "spec": {
        "priorityLevelConfiguration": {"name": "campaign-throttle"},
        "matchingPrecedence": 100,
        "rules": [
            {
                "subjects": [
                    {"kind": "ServiceAccount", "serviceAccount": {"namespace": ns, "name": name}}
                    for ns, name in (OPERATOR, PLUGIN)
                ],
                "resourceRules": [
                    {
                        "verbs": ["*"],
                        "apiGroups": ["*"],
                        "resources": ["*"],
                        "clusterScope": True,
                        "namespaces": ["*"],
                    }
                ],
            }
        ],
    },
}
XID = "XID 79"
XID_NOTICED_S = 15.0  # the plugin's health poll, its GPUNode write, the operator's watch


async def list_pods(
    core: client.CoreV1Api, *, field: str = "", label: str = "", limit: int | None = None
) -> list[dict[str, Any]]:
    extra: dict[str, Any] = {"limit": limit} if limit else {}
    items = await retrying(
        lambda: raw_json(
            core.list_namespaced_pod(
                "default",
                field_selector=field,
                label_selector=label,
                _preload_content=False,
                **extra,
            )
        )
    )
    return cast(list[dict[str, Any]], items["items"])


def waiting_reason(pod: dict[str, Any]) -> str | None:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return str(condition.get("message", ""))
    return None


async def settle(
    core: client.CoreV1Api,
    operators: list[OperatorProcess],
    *,
    deadline_s: float,
    gone_nodes: set[str],
) -> None:
    """Until every pod is Running, refused by its kubelet, or Unschedulable with a reason.
    A bind in flight when its node was deleted lands on the gone node: such pods are deleted
    as kube-controller-manager's pod GC deletes pods bound to nodes that no longer exist."""
    deadline = time.monotonic() + deadline_s
    unsettled: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        pods = await list_pods(core)
        for orphan in [p for p in pods if p["spec"].get("nodeName") in gone_nodes]:
            await retrying(
                lambda name=orphan["metadata"]["name"]: raw_json(  # type: ignore[misc]
                    core.delete_namespaced_pod(
                        name, "default", grace_period_seconds=0, _preload_content=False
                    )
                ),
                missing_ok=True,
            )
        pods = [p for p in pods if p["spec"].get("nodeName") not in gone_nodes]
        unsettled = [
            p
            for p in pods
            if not (
                p["status"].get("phase") in ("Running", "Failed")
                or (not p["spec"].get("nodeName") and waiting_reason(p))
            )
        ]
        if not unsettled:
            return
        await asyncio.sleep(1)
    raise AssertionError(
        f"seed {SEED}: {len(unsettled)} pods never settled:\n"
        + "\n".join(pod_state(p, operators) for p in unsettled[:5])
    )


def pod_state(pod: dict[str, Any], operators: list[OperatorProcess]) -> str:
    """What a reader needs to tell why a pod never settled: its state and what the operators
    logged about it."""
    name = pod["metadata"]["name"]
    annotations = pod["metadata"].get("annotations") or {}
    logged = [
        event
        for operator in operators
        for event in operator.log_events()
        if str(event.get("pod", "")).endswith(f"/{name}")
    ]
    return json.dumps(
        {
            "name": name,
            "node": pod["spec"].get("nodeName"),
            "limits": pod["spec"]["containers"][0]["resources"].get("limits"),
            "annotations": {k: v for k, v in annotations.items() if "volcano" in k},
            "status": pod["status"],
            "operator_log": logged[-20:],
        }
    )


async def check_invariants(
    core: client.CoreV1Api,
    api: client.ApiClient,
    nodes: list[FakeNode],
    operators: list[OperatorProcess],
    *,
    fired: list[Fired],
    gone_nodes: set[str],
    deleted: set[str],
) -> None:
    pods = await list_pods(core)
    check_started(pods, nodes, fired)
    check_given(pods, nodes)
    await check_records(core, api, fired, gone_nodes, deleted)


def check_bound_by_the_leader(
    plane: ControlPlane, operators: list[OperatorProcess], pods: list[dict[str, Any]]
) -> None:
    """Each pod on a node got there by a Binding from the operator's ServiceAccount, as the
    apiserver's audit log records: taken (201), or answered 5xx while its write went through
    (the apiserver stopped or etcd slow: a timeout, yet bound); the operators' logs claim no
    Binding the apiserver did not take. Each names the Lease term it was sent in, and none
    landed after a later term began (by more than the apiserver's Lease cache may lag): a
    leader paused mid-write bound nothing once a standby had taken over."""
    taken, unanswered, refusals = audited_bindings(plane)
    starts: dict[str, float] = {}  # term: when its holder began leading
    for operator in operators:
        for event in operator.log_events():
            if event.get("event") == "started_leading" and event.get("term"):
                starts.setdefault(event["term"], logged_at(operator, event))
    problems = []
    for pod in pods:
        meta, name = pod["metadata"], f"default/{pod['metadata']['name']}"
        if not pod["spec"].get("nodeName"):
            continue
        term = (meta.get("annotations") or {}).get(contract.LEADER_TERM, "")
        if name not in taken and not unanswered[name]:
            problems.append(f"{name}: on a node without a Binding")
        elif not _labelled_in(meta, term) or term not in starts:
            problems.append(f"{name}: bound outside a term ({term!r})")
        elif name in taken:
            later = [at for t, at in starts.items() if transitions(t) > transitions(term)]
            if later and taken[name] > min(later) + LEASE_CACHE_LAG_S:
                problems.append(
                    f"{name}: bound in term {term} {taken[name] - min(later):.2f} s "
                    "after the next began"
                )
    assert not problems, (SEED, problems[:5])
    claimed = {
        event["pod"]
        for operator in operators
        for event in operator.log_events()
        if event.get("event") == "pod_bound"
    }
    assert claimed <= set(taken), (SEED, claimed - set(taken))
    print(
        f"Bindings taken {len(taken)} in {len(starts)} terms, answered 5xx "
        f"{sum(unanswered.values())}, refused by code {dict(refusals)}"
    )


def audited_bindings(plane: ControlPlane) -> tuple[dict[str, float], Counter[str], Counter[int]]:
    """From the apiserver's audit log: when each pod's Binding was taken; the Bindings per pod
    answered 5xx but for the test's own (whose write may have gone through); the count of the
    other refusals by code (409 already bound, 422 a term over, 404 gone)."""
    taken: dict[str, float] = {}
    unanswered: Counter[str] = Counter()
    refusals = Counter[int]()
    operator_user = "system:serviceaccount:{}:{}".format(*OPERATOR)
    for event in plane.audited("binding"):
        pod = f"{event['objectRef']['namespace']}/{event['objectRef']['name']}"
        assert event["user"]["username"] == operator_user, (SEED, pod, event["user"])
        status = event["responseStatus"]
        if status["code"] == 201:
            taken[pod] = stamp(event["stageTimestamp"].replace("Z", "+00:00"))
        elif status["code"] >= 500 and INJECTED not in status.get("message", ""):
            unanswered[pod] += 1  # the test's own 500s refuse before anything is written
        else:
            refusals[status["code"]] += 1
    assert taken, SEED
    return taken, unanswered, refusals


def transitions(term: str) -> int:
    """A Lease term's count of holder changes (its last part)."""
    return int(term.rsplit("/", 1)[1])


def causes_of(at: float, faults: list[Fired]) -> list[str]:
    """The faults, in firing order, that a refusal at `at` (unix seconds) follows closely
    enough to be explained by them."""
    return [f.name for f in faults if f.start - 1 <= at <= f.end + REFUSAL_GRACE_S]


def check_not_admitted(not_admitted: dict[str, float], fired: list[Fired]) -> None:
    """Each pod refused at creation as not admitted was created while a fault left the
    webhook without a replica to answer."""
    unexplained = {}
    refusals = Counter[str]()
    for name, at in not_admitted.items():
        causes = causes_of(at, [f for f in fired if f.name in WEBHOOK_FAULTS])
        if not causes:
            unexplained[name] = at
        refusals.update(causes[-1:])
    print("refused at creation as not admitted, by fault:", dict(refusals))
    assert not unexplained, (SEED, unexplained)


def kubelet_lines(nodes: list[FakeNode], event: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each pod uid's last `event` line of its kubelet, with the node."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for node in nodes:
        for line in node.kubelet.log_events():
            if line.get("event") == event:
                found[str(line.get("uid"))] = (node.name, line)
    return found


def check_started(pods: list[dict[str, Any]], nodes: list[FakeNode], fired: list[Fired]) -> None:
    """Each Running GPU pod was started with its grant's env; each refused one was refused
    by its kubelet with a reason, within a fault fired on its node or on the cluster."""
    started = kubelet_lines(nodes, "started")
    rejected = kubelet_lines(nodes, "rejected")
    unexplained = []
    refusals = Counter[str]()
    for pod in pods:
        name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
        request = gpu_request(pod)
        phase = pod["status"].get("phase")
        if phase == "Failed":
            assert pod["status"].get("reason") == "UnexpectedAdmissionError", (SEED, name)
            assert uid in rejected, (SEED, name, "failed, but not refused by its kubelet")
            node, line = rejected[uid]
            at = stamp(line["time"])
            causes = causes_of(
                at, [f for f in fired if f.causes_refusals and (f.nodes is None or node in f.nodes)]
            )
            if not causes:
                unexplained.append((name, node, line["time"], line["message"]))
            refusals.update(causes[-1:])
            continue
        if phase != "Running" or request.kind is None:
            continue
        assert uid in started, (SEED, name, "Running, but never started by its kubelet")
        envs = started[uid][1]["envs"]
        cards = parse_card_indices(
            pod["metadata"]["annotations"][contract.GPU_INDEX], key="gpu-index", owner=name
        )
        shown = parse_card_indices(envs[contract.ENV_VISIBLE_DEVICES], key="env", owner=name)
        if request.kind is GpuKind.MEMORY:
            assert shown == cards, (SEED, name, shown, cards)
            asked = kubelet_order(request)[0].amount * UNIT_MIB
            assert envs[contract.ENV_GPU_ALLOCATED] == str(asked), (SEED, name, envs)
        else:
            assert set(shown) <= set(cards), (SEED, name, shown, cards)
            assert len(shown) == kubelet_order(request)[0].amount, (SEED, name, shown)
    print("kubelet refusals by fault:", dict(refusals))
    assert not unexplained, (SEED, unexplained[:5])


def check_given(pods: list[dict[str, Any]], nodes: list[FakeNode]) -> None:
    """What the running containers were given, summed per card, fits the card; a card given
    whole is given to one pod alone."""
    started = kubelet_lines(nodes, "started")
    shared: Counter[tuple[str, int]] = Counter()
    whole: Counter[tuple[str, int]] = Counter()
    for pod in pods:
        uid = pod["metadata"]["uid"]
        if pod["status"].get("phase") != "Running" or uid not in started:
            continue
        node, line = started[uid]
        envs = line["envs"]
        shown = parse_card_indices(envs[contract.ENV_VISIBLE_DEVICES], key="env", owner=uid)
        if gpu_request(pod).kind is GpuKind.MEMORY:
            shared[(node, shown[0])] += int(envs[contract.ENV_GPU_ALLOCATED])
        else:
            whole.update((node, card) for card in shown)
    assert all(mib <= CARD for mib in shared.values()), (SEED, shared.most_common(3))
    assert all(count == 1 for count in whole.values()), (SEED, whole.most_common(3))
    assert not set(whole) & set(shared), (SEED, set(whole) & set(shared))


async def check_records(
    core: client.CoreV1Api,
    api: client.ApiClient,
    fired: list[Fired],
    gone_nodes: set[str],
    deleted: set[str],
) -> None:
    """The placement records add up: valid `gpu-index`es within each card, GPUNode statuses
    that say the same, no stale PodScheduled=False, and each pod left unbound is one the
    model finds no room for (the operator retries a pod when room is freed: waited for)."""
    deadline = time.monotonic() + 90
    while True:
        problems = await record_problems(core, api, fired, gone_nodes, deleted)
        if not problems or time.monotonic() > deadline:
            break
        await asyncio.sleep(2)
    assert not problems, (SEED, problems[:5])


async def record_problems(
    core: client.CoreV1Api,
    api: client.ApiClient,
    fired: list[Fired],
    gone_nodes: set[str],
    deleted: set[str],
) -> list[str]:
    pods = await list_pods(core)
    node_bodies = (await raw_json(core.list_node(_preload_content=False)))["items"]
    resources = (
        await raw_json(
            client.CustomObjectsApi(api).list_cluster_custom_object(
                "gpushare.io", "v1alpha1", "gpunodes", _preload_content=False
            )
        )
    )["items"]
    statuses = {r["metadata"]["name"]: r.get("status") or {} for r in resources}
    by_name = {r["metadata"]["name"]: r for r in resources}
    inventories: dict[str, NodeInventory] = {}
    ledger = Ledger()
    for body in node_bodies:
        inventory = node_inventory(body, by_name.get(body["metadata"]["name"]))
        assert inventory is not None
        inventories[inventory.node] = inventory
        ledger.set_node(inventory)
    problems: list[str] = []
    for pod in pods:
        name = pod["metadata"]["name"]
        assert name not in deleted, (SEED, name, "deleted while binding, yet here")
        claim = claim_of(pod)
        if claim.allocation is None:
            continue
        assert claim.allocation.node not in gone_nodes, (SEED, name)
        check_placed(pod, claim.allocation, inventories[claim.allocation.node], fired)
        ledger.add(claim.allocation)
        problems += bound_pod_problems(pod)
    for usage in ledger.nodes().values():
        assert (usage.unattributed_memory, usage.unattributed_cards) == (0, 0), SEED
        shown = {c.get("index"): c for c in statuses.get(usage.inventory.node, {}).get("cards", [])}
        for card in usage.cards.values():
            where = (usage.inventory.node, card.card.index)
            assert card.used <= card.card.memory, (SEED, where)
            assert card.exclusive <= 1, (SEED, where)
            assert not card.exclusive or len(card.pods) == 1, (SEED, where, card.pods)
            status = shown.get(card.card.index) or {}
            pods_there = sorted(str(p) for p in card.pods.values())
            if status.get("pods") != pods_there or status.get("healthy") != card.card.healthy:
                problems.append(f"GPUNode {where}: status {status} != record {pods_there}")
    for pod in pods:
        if pod["spec"].get("nodeName"):
            continue
        name = pod["metadata"]["name"]
        if not waiting_reason(pod):
            problems.append(f"{name}: unbound without PodScheduled=False")
        elif find_placement(ledger, gpu_request(pod)) is not None:
            problems.append(f"{name}: Unschedulable, yet the model finds it room")
        events = (
            await raw_json(
                core.list_namespaced_event(
                    "default", field_selector=f"involvedObject.name={name}", _preload_content=False
                )
            )
        )["items"]
        if not any(e["reason"] == "FailedScheduling" for e in events):
            problems.append(f"{name}: Unschedulable without a FailedScheduling event")
    return problems


def bound_pod_problems(pod: dict[str, Any]) -> list[str]:
    """A bound pod keeps no PodScheduled=False; a running one is marked gpu-assigned."""
    name, problems = pod["metadata"]["name"], []
    if waiting_reason(pod):
        problems.append(f"{name}: bound, yet PodScheduled=False ({waiting_reason(pod)})")
    running = pod["status"].get("phase") == "Running"
    if running and not gpu_assigned(pod["metadata"]["annotations"]):
        problems.append(f"{name}: Running, yet not marked gpu-assigned")
    return problems


def check_placed(
    pod: dict[str, Any], allocation: Allocation, inventory: NodeInventory, fired: list[Fired]
) -> None:
    """A valid `gpu-index`; on a card that failed, placed before the failure was known (when
    the apiserver took the Binding: `predicate-time` is the binding replica's clock, and one
    replica's runs ahead)."""
    cards = [inventory.card(c) for c in allocation.cards]
    if not any(card is not None and not card.healthy for card in cards):
        check_allocation(allocation, inventory)
        return
    scheduled = next(
        c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"
    )  # set by the Binding, to the second
    bound_at = stamp(scheduled["lastTransitionTime"].replace("Z", "+00:00"))
    failed = [f.end for f in fired if f.name == XID and f.nodes and allocation.node in f.nodes]
    late = not failed or bound_at > max(failed) + XID_NOTICED_S
    assert not late, (SEED, pod["metadata"]["name"], "bound to a card after it failed")


async def check_one_leader(api: client.ApiClient, operators: list[OperatorProcess]) -> None:
    """Exactly one operator leads, and the Lease names it."""
    leading = [o for o in operators if leading_since(o) is not None]
    lease = await raw_json(
        client.CoordinationV1Api(api).read_namespaced_lease(
            "gpushare-scheduler",
            "gpushare-system",
            _preload_content=False,
        )
    )
    assert len(leading) == 1, (SEED, [o.name for o in leading])
    assert lease["spec"]["holderIdentity"] == leading[0].identity, (SEED, lease["spec"])
