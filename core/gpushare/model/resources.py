"""Pod requests and node allocatable for every resource, in the integer units kube-scheduler
compares: millicores for cpu, plain units (bytes, pods, devices) for everything else.

A pod's requests follow the same rule as its GPU request (`request.pod_total`): requests
(defaulting to limits, as the apiserver defaults them), app containers and sidecars together
against each plain init container, plus the pod overhead; every pod also takes one `pods` slot.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal

from gpushare.model.bodies import Body, describe, mapping, path, sequence
from gpushare.model.quantity import parse_decimal
from gpushare.model.request import pod_total

PODS = "pods"
_MILLI = frozenset({"cpu"})


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
    for name, amount in resource_list(spec.get("overhead"), owner=f"{who} overhead").items():
        total[name] = total.get(name, 0) + amount
    total[PODS] = total.get(PODS, 0) + 1
    return {name: amount for name, amount in total.items() if amount}


def add_into(total: dict[str, int], amounts: Mapping[str, int], sign: int = 1) -> None:
    """total += sign * amounts, dropping resources that reach zero."""
    for name, amount in amounts.items():
        value = total.get(name, 0) + sign * amount
        if value:
            total[name] = value
        else:
            total.pop(name, None)
