"""Pod requests and node allocatable for every resource, in the integer units kube-scheduler
compares: millicores for cpu, plain units (bytes, pods, devices) for everything else.

A pod's requests follow the same rule as its GPU request (`request.pod_total`): requests
(defaulting to limits, as the apiserver defaults them), app containers and sidecars together
against each plain init container, plus the pod overhead; every pod also takes one `pods` slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal

from gpushare.model.bodies import Body, describe, mapping, path, sequence, text
from gpushare.model.quantity import parse_decimal
from gpushare.model.request import pod_total

PODS = "pods"
HOST_PORT = "hostport/"
"""A host port a pod's container binds (`hostport/TCP/8080`), counted among its requests as
one unit: a node has none of it free once a pod there holds it."""
_MILLI = frozenset({"cpu"})
_POD_LEVEL = frozenset({"cpu", "memory"})
_HUGE_PAGES = "hugepages-"
"""What pod-level `spec.resources` may set (Kubernetes 1.34+ by default; huge pages too): they
then stand for the containers' sum, as kube-scheduler counts them."""


def scaled(resource: str, amount: Decimal) -> int:
    """`amount` of `resource` in the units kube-scheduler compares (rounded up)."""
    if resource in _MILLI:
        amount *= 1000
    return int(amount.to_integral_value(rounding=ROUND_CEILING))


def resource_list(raw: object, *, owner: str) -> dict[str, int]:
    """A ResourceList (``{"cpu": "500m", "memory": "1Gi"}``) in scheduler units.

    Raises InvalidQuantity naming `owner` and the resource."""
    return {
        name: scaled(name, parse_decimal(value, where=f"{owner}: {name} {value!r}"))
        for name, value in mapping(raw).items()
    }


def pod_requests(pod: Body) -> dict[str, int]:
    """What `pod` takes from its node, resource by resource (InvalidQuantity if unreadable)."""
    spec = path(pod, "spec")
    who = describe(pod, "pod")
    app: list[dict[str, int]] = []
    init: list[tuple[dict[str, int], bool]] = []
    for field, is_init in (("containers", False), ("initContainers", True)):
        for container in sequence(spec.get(field)):
            resources = mapping(container.get("resources"))
            owner = f"{who} container {container.get('name')}"
            requests = {
                **resource_list(resources.get("limits"), owner=owner),
                **resource_list(resources.get("requests"), owner=owner),
            }
            if is_init:
                init.append((requests, container.get("restartPolicy") == "Always"))
            else:
                app.append(requests)
    names = {name for r in app for name in r} | {name for r, _ in init for name in r}
    total = {
        name: pod_total((r.get(name, 0) for r in app), ((r.get(name, 0), s) for r, s in init))
        for name in names
    }
    # The apiserver defaults pod-level requests (from the containers' or the pod's limits):
    # a stored pod that sets pod-level resources carries them.
    pod_level = path(spec, "resources").get("requests")
    for name, amount in resource_list(pod_level, owner=f"{who} spec.resources").items():
        if name in _POD_LEVEL or name.startswith(_HUGE_PAGES):
            total[name] = amount
    for name, amount in resource_list(spec.get("overhead"), owner=f"{who} overhead").items():
        total[name] = total.get(name, 0) + amount
    total[PODS] = total.get(PODS, 0) + 1
    for port in host_ports(pod):
        total[port] = 1
    return {name: amount for name, amount in total.items() if amount}


def host_ports(pod: Body) -> frozenset[str]:
    """The host ports the pod's app and sidecar containers bind (a hostNetwork pod's
    containerPorts are its hostPorts: the apiserver writes them so), any host IP taken as
    all of them."""
    spec = path(pod, "spec")
    containers = [*sequence(spec.get("containers"))] + [
        c for c in sequence(spec.get("initContainers")) if c.get("restartPolicy") == "Always"
    ]
    return frozenset(
        f"{HOST_PORT}{text(port.get('protocol')) or 'TCP'}/{port['hostPort']}"
        for container in containers
        for port in sequence(container.get("ports"))
        if isinstance(port.get("hostPort"), int) and port["hostPort"] > 0
    )


def add_into(total: dict[str, int], amounts: Mapping[str, int], sign: int = 1) -> None:
    """total += sign * amounts, dropping resources that reach zero."""
    for name, amount in amounts.items():
        value = total.get(name, 0) + sign * amount
        if value:
            total[name] = value
        else:
            total.pop(name, None)
