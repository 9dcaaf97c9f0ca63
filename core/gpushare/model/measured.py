"""What the processes on a node's cards really hold, by container: pure, no I/O.

The device plugin lists the processes on each card (NVML: pid and memory, CUDA context
included), reads each pid's cgroup, and maps it here to a pod and container
(`container_of`, both cgroup drivers of the kubelet, cgroup v1 and v2, containerd, CRI-O and
Docker names), then to what that container was granted (`measure`). A process that maps to no
container the plugin knows is counted apart, per card (`unmapped_mib`), and is never acted on.

The result travels as the GPUNode annotation `gpushare.io/measured-usage` (`to_annotation`,
`from_annotation`), from which the operator writes it into the GPUNode's status and judges
over-use (`gpushare.model.overuse`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from gpushare.model import contract
from gpushare.model.annotations import CardIndex
from gpushare.model.bodies import Body, annotations_of, path, text
from gpushare.model.errors import InvalidAnnotation
from gpushare.model.usage import PodRef, PodUid

_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
_RUNTIME_PREFIXES = ("cri-containerd-", "crio-", "docker-", "containerd-")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class CgroupPlace:
    """Where a process's cgroup says it runs: the containers its path names (by runtime id,
    outermost first) and, where the path names it, the pod (by UID)."""

    pod_uid: PodUid | None
    container_ids: tuple[str, ...]

    def container_in(self, known: Mapping[str, _T]) -> _T | None:
        """What `known` holds of the outermost container the path names that it knows: a
        process in a cgroup below its container's is that container's, whether crun put it
        there (`.../crio-<id>.scope/container`) or the container made it (named like another
        container, it still names no other); and a node that is itself a container (kind)
        names one nobody knows above them all."""
        return next((known[c] for c in self.container_ids if c in known), None)


def container_of(cgroup: str) -> CgroupPlace | None:
    """Where a process runs, from the text of its /proc/<pid>/cgroup; None for a process in
    no container (the node's own). Every layout: cgroup v1 and v2, the kubelet's `systemd`
    and `cgroupfs` drivers with or without per-QoS cgroups (then no pod in the path:
    `/k8s.io/<id>`), containerd, CRI-O (runc and crun) and Docker names."""
    for line in cgroup.splitlines():
        path = line.split(":", 2)[-1].rstrip("/")
        ids = tuple(c for c in map(_container_id, path.split("/")) if c is not None)
        if ids:
            pod = _POD.search(path)
            return CgroupPlace(PodUid(pod[1].replace("_", "-")) if pod else None, ids)
    return None


def _container_id(part: str) -> str | None:
    """The runtime id a cgroup's name gives (`cri-containerd-<id>.scope`, `<id>`...), if any."""
    for prefix in _RUNTIME_PREFIXES:
        part = part.removeprefix(prefix)
    part = part.removesuffix(".scope")
    return part if _CONTAINER_ID.fullmatch(part) else None


@dataclass(frozen=True, slots=True)
class Grant:
    """What a container was given: the MiB it may hold on each of its cards."""

    mib: Mapping[CardIndex, int]
    known: bool = True
    """False for a GPU container whose grant cannot be worked out (served before the plugin
    restarted, its card since gone or unhealthy, its node's unit changed): its use is shown,
    never judged."""


UNKNOWN_GRANT = Grant({}, known=False)


@dataclass(frozen=True, kw_only=True, slots=True)
class ContainerUse:
    pod: PodRef
    container: str
    card: CardIndex
    used_mib: int
    granted_mib: int | None
    """0 on a card the container was not given; None when its grant is not known
    (`UNKNOWN_GRANT`): then it is never over."""

    @property
    def over(self) -> bool:
        return self.granted_mib is not None and self.used_mib > self.granted_mib


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredUsage:
    at: str
    """When it was measured (RFC 3339)."""
    containers: tuple[ContainerUse, ...]
    unmapped_mib: Mapping[CardIndex, int]
    """Memory of processes that map to no known container, per card: never acted on."""

    def to_annotation(self) -> str:
        containers: dict[str, list[dict[str, object]]] = {}
        for use in self.containers:
            containers.setdefault(str(use.card), []).append(
                {
                    "pod": f"{use.pod.namespace}/{use.pod.name}",
                    "uid": use.pod.uid,
                    "container": use.container,
                    "usedMiB": use.used_mib,
                    "grantedMiB": use.granted_mib,
                }
            )
        cards: dict[str, dict[str, object]] = {
            card: {"containers": entries} for card, entries in containers.items()
        }
        for card, mib in self.unmapped_mib.items():
            cards.setdefault(str(card), {"containers": []})["unmappedMiB"] = mib
        return json.dumps({"at": self.at, "cards": cards}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_annotation(cls, raw: str, *, owner: str) -> MeasuredUsage:
        """Read back `to_annotation`'s text; InvalidAnnotation naming `owner` if it is not."""
        try:
            decoded = json.loads(raw)
            containers = []
            unmapped: dict[CardIndex, int] = {}
            for card, entry in decoded["cards"].items():
                index = CardIndex(int(card))
                for item in entry.get("containers", []):
                    namespace, _, name = str(item["pod"]).partition("/")
                    containers.append(
                        ContainerUse(
                            pod=PodRef(namespace=namespace, name=name, uid=PodUid(item["uid"])),
                            container=str(item["container"]),
                            card=index,
                            used_mib=int(item["usedMiB"]),
                            granted_mib=(
                                None if item["grantedMiB"] is None else int(item["grantedMiB"])
                            ),
                        )
                    )
                if "unmappedMiB" in entry:
                    unmapped[index] = int(entry["unmappedMiB"])
            return cls(
                at=str(decoded["at"]),
                containers=tuple(sorted(containers, key=_order)),
                unmapped_mib=unmapped,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise InvalidAnnotation(
                f"{owner}: its measured usage is not what the device plugin writes ({error})"
            ) from error


def measured_of(gpunode: Body) -> MeasuredUsage | None:
    """What the node's device plugin last measured, from its GPUNode; None when it has not
    (a plugin too old, or a fake card without processes) or its annotation cannot be read."""
    raw = annotations_of(gpunode).get(contract.MEASURED_USAGE)
    if raw is None:
        return None
    name = text(path(gpunode, "metadata").get("name")) or ""
    try:
        return MeasuredUsage.from_annotation(raw, owner=f"GPUNode {name}")
    except InvalidAnnotation:
        return None


@dataclass(frozen=True, slots=True)
class Process:
    pid: int
    card: CardIndex
    used_mib: int | None


def measure(
    processes: Iterable[Process],
    places: Mapping[int, CgroupPlace | None],
    containers: Mapping[str, tuple[PodRef, str]],
    grants: Mapping[tuple[PodUid, str], Grant],
    *,
    at: str,
) -> MeasuredUsage:
    """Each container's memory on each card, with what it was granted there.

    `places`: each pid's cgroup place; `containers`: container id -> (the pod, the container's
    name), for the pods bound to the node (their status names each container's id);
    `grants`: (pod UID, container name) -> what it was given. A process of no known
    container (or whose cgroup names another pod than the id's) is unmapped; a container
    not in `grants` was given nothing anywhere (a pod that asked for no GPU, an ephemeral
    container: its use is reported, and over); one granted `UNKNOWN_GRANT` is reported, and
    never over."""
    used: dict[tuple[PodUid, str, CardIndex], int] = {}
    refs: dict[tuple[PodUid, str], PodRef] = {}
    unmapped: dict[CardIndex, int] = {}
    for process in processes:
        mib = process.used_mib or 0
        place = places.get(process.pid)
        known = place.container_in(containers) if place else None
        if known is None or (place and place.pod_uid not in (None, known[0].uid)):
            unmapped[process.card] = unmapped.get(process.card, 0) + mib
            continue
        ref, name = known
        refs[(ref.uid, name)] = ref
        key = (ref.uid, name, process.card)
        used[key] = used.get(key, 0) + mib
    found = []
    for (uid, name, card), mib in used.items():
        grant = grants.get((uid, name))
        granted = 0 if grant is None else grant.mib.get(card, 0) if grant.known else None
        found.append(
            ContainerUse(
                pod=refs[(uid, name)], container=name, card=card, used_mib=mib, granted_mib=granted
            )
        )
    return MeasuredUsage(at=at, containers=tuple(sorted(found, key=_order)), unmapped_mib=unmapped)


def _order(use: ContainerUse) -> tuple[int, str, str, str]:
    return use.card, use.pod.namespace, use.pod.name, use.container
