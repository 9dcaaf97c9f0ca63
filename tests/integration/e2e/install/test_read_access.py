"""What people may read, with the shipped roles (manifests/base/rbac/users.yaml) on a control
plane whose controller-manager aggregates ClusterRoles: a tenant with the built-in `edit` role
in one namespace only reads GPUNodes, GPUShareConfigs and the operator's Lease, and writes
none of them; `view`, `edit` and `admin` aggregate the read role (for users bound to them
cluster-wide); without the binding to every authenticated user, `edit` in a namespace reads
no GPUNode (why the binding exists); `gpushare-config-editor`, once bound, writes the live
configuration."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from cluster import eventually
from kubernetes_asyncio import client

from gpushare.kube import raw_json
from gpushare.model import contract
from gpushare_harness import ControlPlane
from gpushare_harness.identities import tenant_kubeconfig

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TENANT = "team-a"
EXAMPLES = Path(__file__).resolve().parents[4] / "manifests" / "examples"
GPUNODE = {
    "apiVersion": f"{contract.INVENTORY_GROUP}/{contract.INVENTORY_VERSION}",
    "kind": contract.INVENTORY_KIND,
    "metadata": {"name": "n1"},
    "spec": {"memoryUnitMiB": 512, "cards": []},
}


@pytest.fixture
def plane(control_plane: ControlPlane, tmp_path: Path) -> Iterator[ControlPlane]:
    own = ControlPlane(tmp_path / "plane", binaries=control_plane.binaries, controllers=True)
    with own:
        yield own


def kubectl(plane: ControlPlane, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(plane.binaries.kubectl), "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def can(plane: ControlPlane, kubeconfig: Path, *args: str) -> bool:
    answer = kubectl(plane, kubeconfig, "auth", "can-i", *args)
    assert answer.stdout.strip() in {"yes", "no"}, answer.stderr
    return answer.stdout.strip() == "yes"


async def tenant(core: client.CoreV1Api, plane: ControlPlane, tmp_path: Path) -> Path:
    await core.create_namespace(cast(client.V1Namespace, {"metadata": {"name": TENANT}}))
    return await tenant_kubeconfig(core, plane.kubeconfig, TENANT, tmp_path / "tenant")


async def objects(api: client.ApiClient) -> None:
    """A GPUNode and the operator's Lease, as an install has them."""
    custom = client.CustomObjectsApi(api)
    await custom.create_cluster_custom_object(
        contract.INVENTORY_GROUP, contract.INVENTORY_VERSION, "gpunodes", GPUNODE
    )
    lease = {"metadata": {"name": "gpushare-scheduler"}, "spec": {"holderIdentity": "op-1"}}
    await raw_json(
        client.CoordinationV1Api(api).create_namespaced_lease(
            "gpushare-system", cast(client.V1Lease, lease), _preload_content=False
        )
    )


async def test_a_tenant_with_edit_in_one_namespace_reads_gpunodes_and_writes_none(
    plane: ControlPlane, api: client.ApiClient, core: client.CoreV1Api, tmp_path: Path
) -> None:
    await objects(api)
    config = await tenant(core, plane, tmp_path)
    listed = kubectl(plane, config, "get", "gpunodes")
    assert listed.returncode == 0, listed.stderr
    assert "n1" in listed.stdout
    assert kubectl(plane, config, "get", "gpunode", "n1", "-o", "json").returncode == 0
    assert kubectl(plane, config, "get", "gpushareconfigs").returncode == 0
    lease = kubectl(plane, config, "-n", "gpushare-system", "get", "lease", "gpushare-scheduler")
    assert lease.returncode == 0, lease.stderr
    for refused in (
        ("patch", "gpunodes/n1"),
        ("delete", "gpunodes"),
        ("create", "gpushareconfigs"),
        ("update", "gpushareconfigs/default"),
        ("list", "leases", "-n", "gpushare-system"),
        ("get", "leases/other", "-n", "gpushare-system"),
        ("get", "secrets", "-n", "gpushare-system"),
    ):
        assert not can(plane, config, *refused), refused
    assert can(plane, config, "create", "pods", "-n", TENANT)  # the edit role itself


async def test_view_edit_and_admin_aggregate_the_read_role(
    plane: ControlPlane, api: client.ApiClient
) -> None:
    rbac = client.RbacAuthorizationV1Api(api)

    async def aggregated() -> set[str]:
        found = set()
        for role in ("view", "edit", "admin"):
            body = await raw_json(rbac.read_cluster_role(role, _preload_content=False))
            if any(
                {"gpunodes", "gpushareconfigs"} <= set(rule.get("resources", []))
                and rule.get("apiGroups") == ["gpushare.io"]
                for rule in body.get("rules") or []
            ):
                found.add(role)
        return found if found == {"view", "edit", "admin"} else set()

    await eventually(aggregated, timeout_s=30, what="view, edit and admin aggregating it")


async def test_without_the_binding_edit_in_a_namespace_reads_no_gpunode(
    plane: ControlPlane, api: client.ApiClient, core: client.CoreV1Api, tmp_path: Path
) -> None:
    """Aggregation alone: `edit` carries the read rule, but bound in one namespace it grants
    nothing on cluster-scoped GPUNodes. The binding to every authenticated user does."""
    config = await tenant(core, plane, tmp_path)
    deleted = kubectl(plane, plane.kubeconfig, "delete", "clusterrolebinding", "gpushare-view")
    assert deleted.returncode == 0, deleted.stderr

    async def unbound() -> bool:
        return not can(plane, config, "list", "gpunodes")

    await eventually(unbound, timeout_s=20, what="the binding gone")
    refused = kubectl(plane, config, "get", "gpunodes")
    assert refused.returncode != 0
    assert "forbidden" in refused.stderr.lower()


async def test_the_config_editor_role_once_bound_writes_the_live_configuration(
    plane: ControlPlane, core: client.CoreV1Api, tmp_path: Path
) -> None:
    config = await tenant(core, plane, tmp_path)
    assert not can(plane, config, "create", "gpushareconfigs")
    bound = kubectl(
        plane, plane.kubeconfig, "create", "clusterrolebinding", "scheduler-admins",
        "--clusterrole=gpushare-config-editor", f"--serviceaccount={TENANT}:tenant",
    )  # fmt: skip
    assert bound.returncode == 0, bound.stderr

    async def applied() -> bool:  # the binding reaches the authorizer a moment later
        result = kubectl(plane, config, "apply", "-f", str(EXAMPLES / "scheduler-config.yaml"))
        return result.returncode == 0

    await eventually(applied, timeout_s=20, what="the live configuration applied")
    assert can(plane, config, "delete", "gpushareconfigs/default")
    assert not can(plane, config, "patch", "gpunodes")
