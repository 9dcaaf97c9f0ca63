"""The network of a cluster with real nodes: one Linux bridge on the host that every real
node's veth joins, in a private /24 the harness picks, and one route per node.

kube-apiserver listens on the bridge's own address (the first of the /24), each node's
namespace gets the next ones; so the apiserver dials the kubelets and the kubelets reach the
apiserver without the host forwarding anything (its ip_forward stays as it is) and without
any traffic to or from the machine's own interface addresses.

Each node's pods get a /24 of their own from 10.214.0.0/16 (`add_pod_route`), free on the
machine, and the host gets one route for it: `<pod /24> via <node's address> dev <bridge>`.
That is all that is added on the host (no NAT, no iptables rule, no forwarding): it lets
kube-apiserver open connections to pod IPs, as a real cluster's does (webhooks whose Service
endpoints are pods, `pods/NAME:PORT/proxy`); the node's namespace forwards them to its pods.
The route is the allocation too: `ip route add` fails for a /24 another run already holds.
A node's route is deleted when it stops (`delete_pod_route`), and goes with the bridge in any
case. Removing the bridge removes the /24 and the routes via it; the veths go with their
nodes' namespaces.

A bridge records its owner in its alias (`gpushare pid=<pid>`): the process whose life it
follows (the apiserver once started). `sweep()` deletes the bridges of owners that are gone,
so a crashed run leaves nothing behind for long.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
from dataclasses import dataclass

from gpushare_harness.controlplane import alive

# Candidate subnets: 10.213.0.0/24 .. 10.213.255.0/24, skipping any in use on the machine.
_POOL = ipaddress.IPv4Network("10.213.0.0/16")
# The nodes' pod subnets, one /24 each, likewise.
_POD_POOL = ipaddress.IPv4Network("10.214.0.0/16")
_ALIAS = "gpushare pid="
_FIRST_NODE_HOST = 10


class NetworkError(RuntimeError):
    """The bridge cannot be made; the message says why and what to do."""


def ip(*args: str, netns_pid: int | None = None) -> str:
    """`ip ARGS` on the host, or inside the network namespace of `netns_pid`."""
    if shutil.which("ip") is None:
        raise NetworkError("iproute2's `ip` is missing (apt-get install iproute2)")
    argv = ["ip", *args]
    if netns_pid is not None:
        argv = ["nsenter", "-t", str(netns_pid), "-n", "--", *argv]
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if result.returncode != 0:
        raise NetworkError(f"`{' '.join(argv)}` failed: {result.stderr.strip()}")
    return result.stdout


@dataclass(frozen=True)
class ClusterNetwork:
    bridge: str
    subnet: ipaddress.IPv4Network

    @property
    def address(self) -> str:
        """The host's address on the bridge: where kube-apiserver listens."""
        return str(self.subnet.network_address + 1)

    def node_address(self, index: int) -> str:
        return str(self.subnet.network_address + _FIRST_NODE_HOST + index)

    @property
    def prefix(self) -> int:
        return self.subnet.prefixlen

    @classmethod
    def create(cls) -> ClusterNetwork:
        """A new bridge with a free /24, owned by this process until `adopt`."""
        if os.geteuid() != 0:
            raise NetworkError("real nodes need root (a bridge, veth pairs, namespaces)")
        sweep()
        bridge = f"gpushare-{secrets.token_hex(3)}"
        subnet = _free_subnet()
        network = cls(bridge, subnet)
        ip("link", "add", bridge, "type", "bridge")
        try:
            network.adopt(os.getpid())
            # No IPv6 link-local address: nothing is sent on the bridge unasked.
            ip("link", "set", bridge, "addrgenmode", "none")
            ip("addr", "add", f"{network.address}/{subnet.prefixlen}", "dev", bridge)
            ip("link", "set", bridge, "up")
        except BaseException:
            network.delete()
            raise
        return network

    def adopt(self, pid: int) -> None:
        """From now on the bridge lives as long as `pid` does."""
        ip("link", "set", "dev", self.bridge, "alias", f"{_ALIAS}{pid}")

    def delete(self) -> None:
        with contextlib.suppress(NetworkError):
            ip("link", "del", self.bridge)

    def add_pod_route(self, node_address: str) -> ipaddress.IPv4Network:
        """A /24 free on the machine for the pods of the node at `node_address`, routed
        there from the host (so kube-apiserver reaches its pods)."""
        for _ in range(8):  # another run may take the /24 between looking and adding
            subnet = _free_subnet(_POD_POOL, "a node's pods")
            try:
                ip("route", "add", str(subnet), "via", node_address, "dev", self.bridge)
            except NetworkError as error:
                if "File exists" in str(error):
                    continue
                raise
            return subnet
        raise NetworkError(f"no /24 of {_POD_POOL} could be routed to {node_address}")

    def to_json(self) -> dict[str, str]:
        return {"bridge": self.bridge, "subnet": str(self.subnet)}

    @classmethod
    def from_json(cls, data: dict[str, str]) -> ClusterNetwork:
        return cls(data["bridge"], ipaddress.IPv4Network(data["subnet"]))


def delete_pod_route(subnet: str, node_address: str, bridge: str) -> None:
    """Remove the route `add_pod_route` added (only that one: via and dev must match too);
    nothing if it is gone already, as it is once the bridge is."""
    with contextlib.suppress(NetworkError):
        ip("route", "del", subnet, "via", node_address, "dev", bridge)


def _free_subnet(
    pool: ipaddress.IPv4Network = _POOL, what: str = "a cluster bridge"
) -> ipaddress.IPv4Network:
    used = [
        ipaddress.ip_network(entry["dst"], strict=False)
        for entry in json.loads(ip("-j", "-4", "route", "show", "table", "all") or "[]")
        if entry.get("dst") not in (None, "default")
    ]
    for candidate in pool.subnets(new_prefix=24):
        if not any(candidate.overlaps(net) for net in used if net.prefixlen > 0):
            return candidate
    raise NetworkError(f"no free /24 left in {pool} for {what}")


def sweep() -> list[str]:
    """Delete the bridges whose owner process is gone; their names."""
    removed = []
    for link in json.loads(ip("-j", "link", "show", "type", "bridge") or "[]"):
        alias = link.get("ifalias", "")
        if not alias.startswith(_ALIAS):
            continue
        pid = int(alias.removeprefix(_ALIAS))
        if not alive(pid):
            with contextlib.suppress(NetworkError):
                ip("link", "del", link["ifname"])
                removed.append(link["ifname"])
    return removed
