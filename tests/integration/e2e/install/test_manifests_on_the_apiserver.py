"""The manifests against the real apiserver: a server-side dry run, then the operator and the
device plugin running with tokens of their own ServiceAccounts, bound by these manifests'
roles, through the guide's scenario with the admission webhook converting the pods (the
operator makes its certificate's Secret and sets the webhook's caBundle): the roles are
enough."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import admitting
import pytest
from admitting import create
from cluster import eventually, gpu_pod
from kubernetes_asyncio import client

from gpushare import kube
from gpushare.model import contract
from gpushare_harness import ControlPlane
from gpushare_harness.controlplane import free_port
from gpushare_harness.crds import install_admission
from gpushare_harness.operator import webhook_url

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

MANIFESTS = Path(__file__).resolve().parents[4] / "manifests"


def kubectl(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(plane.binaries.kubectl), "--kubeconfig", str(plane.kubeconfig), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


async def token_for(core: client.CoreV1Api, account: str, namespace: str) -> str:
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    answer = await core.create_namespaced_service_account_token(account, namespace, request)
    return str(answer.status.token)


async def test_the_manifests_pass_a_server_side_dry_run(plane: ControlPlane) -> None:
    # A dry run creates no namespace, so the namespaced objects need it to exist already.
    namespace = kubectl(plane, "apply", "-f", str(MANIFESTS / "base" / "namespace.yaml"))
    assert namespace.returncode == 0, namespace.stderr
    result = kubectl(plane, "apply", "--dry-run=server", "-k", str(MANIFESTS))
    assert result.returncode == 0, result.stderr
    for created in (
        "customresourcedefinition.apiextensions.k8s.io/gpunodes.gpushare.io",
        "clusterrole.rbac.authorization.k8s.io/gpushare-operator",
        "clusterrole.rbac.authorization.k8s.io/gpushare-device-plugin",
        "deployment.apps/gpushare-operator",
        "daemonset.apps/gpushare-device-plugin",
    ):
        assert created in result.stdout


async def test_the_components_need_no_more_than_their_roles(
    plane: ControlPlane,
    core: client.CoreV1Api,
    tmp_path: Path,
    gpu_node: Callable[..., Any],
    start_operator: Callable[..., Any],
) -> None:
    applied = kubectl(plane, "apply", "-k", str(MANIFESTS))
    assert applied.returncode == 0, applied.stderr
    example = kubectl(plane, "apply", "-f", str(MANIFESTS / "examples" / "scheduler-config.yaml"))
    assert example.returncode == 0, example.stderr
    # The operator and the plugin run on their own tokens (the fixtures' default; the
    # plugin's bound to its Node, as its DaemonSet pod's is).
    # The operator runs on this machine, not behind the Service: call it on loopback.
    port = free_port()
    await install_admission(core.api_client, webhook_url(port))  # type: ignore[attr-defined]
    node = await gpu_node("gpu-node-1", "8x11178", unit_mib=None)
    operator = start_operator(
        GPUSHARE_WEBHOOK_PORT=str(port),
        GPUSHARE_WEBHOOK_HOSTS="127.0.0.1",
    )
    operator.wait_logged("started_leading", timeout_s=20)
    # gpu-pod2 names the frameworks it takes limits for: PyTorch too (2.9 and later read it).
    forged = gpu_pod("gpu-pod1", 1024)
    forged["metadata"]["annotations"] = {contract.GANG_MIN_MEMBER: "1000"}  # the Binding's alone
    await create(core, forged)
    asks = gpu_pod("gpu-pod2", 1024)
    asks["metadata"]["annotations"] = {contract.FRAMEWORK_LIMITS: "pytorch,jax,tensorflow"}
    await create(core, asks)
    for name, pytorch in (("gpu-pod1", {}), ("gpu-pod2", {
        contract.ENV_PYTORCH_ALLOC_CONF: "per_process_memory_fraction:0.045804"
    })):  # fmt: skip
        line = await asyncio.to_thread(
            node.kubelet.wait_started, f"default/{name}", "cuda-container"
        )
        assert line["envs"] == {
            contract.ENV_VISIBLE_DEVICES: "0",
            contract.ENV_GPU_ALLOCATED: "1024",
            contract.ENV_GPU_MEMORY_TOTAL: "11178",
            # The frameworks' limits: 1024 MiB less one CUDA context (512) of 11178 MiB.
            contract.ENV_JAX_MEM_FRACTION: "0.045804",
            contract.ENV_TF_ALLOW_GROWTH: "true",
            **pytorch,
        }
    stored = await core.read_namespaced_pod("gpu-pod1", "default")
    assert contract.GANG_MIN_MEMBER not in (stored.metadata.annotations or {})
    bad = gpu_pod("typo", 1024)
    bad["metadata"]["annotations"] = {contract.FRAMEWORK_LIMITS: "torch"}
    assert "gpushare gives no framework named torch a memory limit" in await admitting.refusal(
        core, bad
    )
    for process in (operator, node.plugin):
        # Every refusal the apiserver gives reads "... is forbidden: User ... cannot ...".
        log = process.log.read_text().lower()
        assert "forbidden" not in log, f"{process.name} was refused:\n{process.tail()}"


async def test_the_operators_calls_share_kube_schedulers_priority_level(
    plane: ControlPlane, core: client.CoreV1Api, tmp_path: Path
) -> None:
    applied = kubectl(plane, "apply", "-k", str(MANIFESTS))
    assert applied.returncode == 0, applied.stderr
    operator_config = plane.token_kubeconfig(
        tmp_path / "operator.kubeconfig",
        "gpushare-operator",
        await token_for(core, "gpushare-operator", "gpushare-system"),
    )
    uids = {}
    for kind, name in (
        ("flowschema", "gpushare-operator"),
        ("prioritylevelconfiguration", "workload-high"),
    ):
        got = kubectl(plane, "get", kind, name, "-o", "jsonpath={.metadata.uid}")
        assert got.returncode == 0, got.stderr
        uids[kind] = got.stdout
    async with await kube.api_client(operator_config) as api:
        # The apiserver names the FlowSchema and priority level that classified each call.
        answer = await api.call_api(
            "/api/v1/nodes",
            "GET",
            query_params=[("limit", "1")],
            auth_settings=["BearerToken"],
            _preload_content=False,
        )
        async with answer:
            assert answer.status == 200
            assert answer.headers["X-Kubernetes-PF-FlowSchema-UID"] == uids["flowschema"]
            assert (
                answer.headers["X-Kubernetes-PF-PriorityLevel-UID"]
                == uids["prioritylevelconfiguration"]
            )


BAD_CONFIGS = [  # (name, spec line, what the apiserver says)
    ("default", "polcy: spread", 'unknown field "spec.polcy"'),
    ("default", "policy: worstfit", 'Unsupported value: "worstfit"'),
    ("default", "bindTimeoutSeconds: -1", "spec.bindTimeoutSeconds: Invalid value"),
    ("default", "schedulerNames: []", "spec.schedulerNames: Invalid value"),
    ("default", "memoryUnitMiB: 1Gi", 'spec.memoryUnitMiB: Invalid value: "string"'),
    ("team-a", "policy: spread", "reads only the GPUShareConfig named default"),
]


@pytest.mark.usefixtures("api")  # installs the CRDs
async def test_a_bad_live_configuration_is_refused_at_apply_time(
    plane: ControlPlane, tmp_path: Path
) -> None:
    def dry_run(name: str, spec: str) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "config.yaml"
        path.write_text(
            f"apiVersion: gpushare.io/v1alpha1\nkind: GPUShareConfig\nmetadata:\n"
            f"  name: {name}\nspec:\n  {spec}\n"
        )
        return kubectl(plane, "apply", "--dry-run=server", "-f", str(path))

    for name, spec, refusal in BAD_CONFIGS:
        refused = dry_run(name, spec)
        assert refused.returncode != 0, (name, spec)
        assert refusal in refused.stderr, refused.stderr
    good = dry_run("default", "policy: spread")
    assert good.returncode == 0, good.stderr


@pytest.mark.usefixtures("api")  # installs the CRDs
async def test_kubectl_documents_the_resources_and_lists_them_as_one_category(
    plane: ControlPlane,
) -> None:
    async def explained_once_published() -> subprocess.CompletedProcess[str] | None:
        # Established is not yet published: the apiserver adds a new CRD's schema to its
        # OpenAPI document (which `kubectl explain` reads) a moment later.
        done = await asyncio.to_thread(kubectl, plane, "explain", "gpushareconfig.spec.policy")
        return done if done.returncode == 0 else None

    explained = await eventually(explained_once_published, timeout_s=30, what="kubectl explain")
    words = " ".join(explained.stdout.split())  # kubectl wraps long descriptions
    assert "bestfit | firstfit | binpack | spread. Default: bestfit ($GPUSHARE_POLICY)" in words
    cards = kubectl(plane, "explain", "gpunode.spec.cards.memoryMiB")
    assert "The card's total memory, MiB." in " ".join(cards.stdout.split()), cards.stderr
    listed = kubectl(plane, "api-resources", "--categories=gpushare", "-o", "name")
    assert sorted(listed.stdout.split()) == ["gpunodes.gpushare.io", "gpushareconfigs.gpushare.io"]
