"""The components on their own identities, as an install runs them: the shipped roles
(manifests/base/rbac: ServiceAccounts, ClusterRoles, bindings and the policies that scope
them) applied to a cluster, and kubeconfigs that authenticate with tokens of those accounts
from the TokenRequest API. The device plugin's token is bound to its Node, so it carries the
node's name (`authentication.kubernetes.io/node-name`), as its DaemonSet pod's projected token
does; tenants get a ServiceAccount bound to the built-in `edit` role in one namespace."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import cast

import yaml
from kubernetes_asyncio import client

from gpushare.kube import ApiError, raw_json

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
ROLES = MANIFESTS / "base" / "rbac"
NAMESPACES = MANIFESTS / "base" / "namespace.yaml"

OPERATOR = ("gpushare-system", "gpushare-operator")
PLUGIN = ("gpushare-device-plugin", "gpushare-device-plugin")
_TOKEN_S = 6 * 3600  # longer than any test or benchmark run


def apply_roles(kubectl: Path, admin: Path) -> None:
    """The shipped namespaces and roles (`kubectl apply`, as an admin applies them)."""
    for path in (NAMESPACES, ROLES):
        result = subprocess.run(
            [str(kubectl), "--kubeconfig", str(admin), "apply", "-f", str(path)],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            raise RuntimeError(f"kubectl apply -f {path} failed:\n{result.stderr}")


async def install_roles(kubectl: Path, admin: Path) -> None:
    await asyncio.to_thread(apply_roles, kubectl, admin)


async def token(
    core: client.CoreV1Api, account: tuple[str, str], *, node: str | None = None
) -> str:
    """A token of `account` (namespace, name); bound to Node `node` when given."""
    namespace, name = account
    spec: dict[str, object] = {"audiences": [], "expirationSeconds": _TOKEN_S}
    if node is not None:
        body = await raw_json(core.read_node(node, _preload_content=False))
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Node",
            "name": node,
            "uid": body["metadata"]["uid"],
        }
    answer = await raw_json(
        core.create_namespaced_service_account_token(
            name,
            namespace,
            cast(client.AuthenticationV1TokenRequest, {"spec": spec}),
            _preload_content=False,
        )
    )
    return str(answer["status"]["token"])


def token_kubeconfig(admin: Path, path: Path, user: str, bearer: str) -> Path:
    """A copy of the admin kubeconfig at `path` that authenticates as `user` with `bearer`."""
    config = yaml.safe_load(admin.read_text())
    config["users"] = [{"name": user, "user": {"token": bearer}}]
    for context in config["contexts"]:
        context["context"]["user"] = user
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def operator_kubeconfig(core: client.CoreV1Api, admin: Path, path: Path) -> Path:
    return token_kubeconfig(admin, path, OPERATOR[1], await token(core, OPERATOR))


async def plugin_kubeconfig(core: client.CoreV1Api, admin: Path, node: str, path: Path) -> Path:
    return token_kubeconfig(admin, path, PLUGIN[1], await token(core, PLUGIN, node=node))


async def tenant_kubeconfig(
    core: client.CoreV1Api, admin: Path, namespace: str, path: Path, name: str = "tenant"
) -> Path:
    """A ServiceAccount `name` of `namespace` with the built-in ClusterRole `edit` there
    (bound by a RoleBinding: nothing cluster-wide), and a kubeconfig with its token."""
    rbac = client.RbacAuthorizationV1Api(core.api_client)  # type: ignore[attr-defined]
    for create in (
        lambda: core.create_namespaced_service_account(
            namespace,
            cast(client.V1ServiceAccount, {"metadata": {"name": name}}),
            _preload_content=False,
        ),
        lambda: rbac.create_namespaced_role_binding(
            namespace,
            cast(
                client.V1RoleBinding,
                {
                    "metadata": {"name": f"{name}-edit"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "edit",
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
                },
            ),
            _preload_content=False,
        ),
    ):
        try:
            await raw_json(create())
        except ApiError as error:
            if error.status != 409:
                raise
    bearer = await token(core, (namespace, name))
    return token_kubeconfig(admin, path, f"{namespace}-{name}", bearer)
