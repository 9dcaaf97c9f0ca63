"""Installing the project's CustomResourceDefinitions (manifests/base/crds) into a cluster,
and its admission objects (manifests/base/admission) for an operator run as a local process;
and the PodGroup CRDs of Volcano and of the scheduler-plugins, as their own releases ship
them (taken from their Go modules, through the Go module proxy)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes_asyncio import client

from gpushare.kube import ApiError, api_client, raw_json

CRD_DIR = Path(__file__).resolve().parents[2] / "manifests" / "base" / "crds"
ADMISSION_DIR = CRD_DIR.parent / "admission"


PODGROUP_CRDS = (
    # (module@version, the CRD's path in it): Volcano's newest release the proxy serves.
    ("volcano.sh/volcano@v1.10.0", "config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml"),
    (
        "sigs.k8s.io/scheduler-plugins@v0.31.8",
        "config/crd/bases/scheduling.x-k8s.io_podgroups.yaml",
    ),
)


def podgroup_crd_files() -> list[Path]:
    """The two PodGroup CRDs, downloaded into the Go module cache (outside the repository)
    the first time."""
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("the Go toolchain is needed to fetch the PodGroup CRDs; put go on PATH")
    files = []
    for module, inner in PODGROUP_CRDS:
        result = subprocess.run(
            [go, "mod", "download", "-json", module],
            capture_output=True,
            text=True,
            check=False,
            cwd=CRD_DIR,
            env={**os.environ, "GOFLAGS": "-mod=mod", "GO111MODULE": "on"},
        )
        info = json.loads(result.stdout or "{}")
        if result.returncode != 0 or "Dir" not in info:
            error = info.get("Error") or result.stderr
            raise RuntimeError(f"go mod download {module} failed: {error}")
        files.append(Path(info["Dir"]) / inner)
    return files


async def install_podgroup_crds(api: client.ApiClient, *, timeout_s: float = 30.0) -> list[str]:
    """Volcano's and the scheduler-plugins' PodGroup CRDs, as `install_crds` installs ours."""
    files = await asyncio.to_thread(podgroup_crd_files)
    return await install_crds(api, timeout_s=timeout_s, files=files)


async def install_crds(
    api: client.ApiClient, *, timeout_s: float = 30.0, files: list[Path] | None = None
) -> list[str]:
    """Create (or leave in place) every CRD under manifests/base/crds (or `files`) and wait
    until each is Established; returns their names."""
    extensions = client.ApiextensionsV1Api(api)
    names = []
    for path in files or sorted(CRD_DIR.glob("*.yaml")):
        body: dict[str, Any] = yaml.safe_load(path.read_text())
        try:
            await extensions.create_custom_resource_definition(
                cast(client.V1CustomResourceDefinition, body)
            )
        except client.ApiException as error:
            if error.status != 409:
                raise
        names.append(body["metadata"]["name"])
    async with asyncio.timeout(timeout_s):
        for name in names:
            while not await _established(extensions, name):  # noqa: ASYNC110 - polls the API
                await asyncio.sleep(0.1)
    return names


async def _established(extensions: client.ApiextensionsV1Api, name: str) -> bool:
    crd = await extensions.read_custom_resource_definition(name)
    conditions = crd.status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


OPERATOR_NAMESPACE = "gpushare-system"


async def install_project(api: client.ApiClient) -> None:
    """The CRDs, and the namespace the operator keeps its Lease in (either may exist)."""
    await install_crds(api)
    try:
        await client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=OPERATOR_NAMESPACE))
        )
    except client.ApiException as error:
        if error.status != 409:
            raise


def install_project_at(kubeconfig: Path) -> None:
    """`install_project` for synchronous callers (the CLI, benchmarks, fixtures)."""

    async def install() -> None:
        async with await api_client(kubeconfig) as api:
            await install_project(api)

    asyncio.run(install())


async def install_admission(api: client.ApiClient, webhook_url: str) -> None:
    """The ValidatingAdmissionPolicy and the MutatingWebhookConfiguration of
    manifests/base/admission, the webhook called at `webhook_url` (an operator on this
    machine, `GPUSHARE_WEBHOOK_ADDRESS=127.0.0.1`) instead of through its Service; the
    operator fills in the caBundle. Objects already there are replaced."""
    admission = client.AdmissionregistrationV1Api(api)
    for path in sorted(ADMISSION_DIR.glob("*.yaml")):
        for body in yaml.safe_load_all(path.read_text()):
            kind = body["kind"]
            if kind == "Service":
                continue
            if kind == "MutatingWebhookConfiguration":
                for webhook in body["webhooks"]:
                    webhook["clientConfig"] = {"url": webhook_url}
            calls: dict[str, tuple[Any, Any]] = {
                "MutatingWebhookConfiguration": (
                    admission.create_mutating_webhook_configuration,
                    admission.replace_mutating_webhook_configuration,
                ),
                "ValidatingAdmissionPolicy": (
                    admission.create_validating_admission_policy,
                    admission.replace_validating_admission_policy,
                ),
                "ValidatingAdmissionPolicyBinding": (
                    admission.create_validating_admission_policy_binding,
                    admission.replace_validating_admission_policy_binding,
                ),
            }
            create, replace = calls[kind]
            try:
                await create(body)
            except client.ApiException as error:
                if error.status != 409:
                    raise
                name = body["metadata"]["name"]
                current = await _read(admission, kind, name)
                body["metadata"]["resourceVersion"] = current
                await replace(name, body)


async def remove_admission(api: client.ApiClient) -> None:
    """The objects `install_admission` wrote, deleted: a cluster installed without them."""
    admission = client.AdmissionregistrationV1Api(api)
    deletes: dict[str, Any] = {
        "MutatingWebhookConfiguration": admission.delete_mutating_webhook_configuration,
        "ValidatingAdmissionPolicy": admission.delete_validating_admission_policy,
        "ValidatingAdmissionPolicyBinding": admission.delete_validating_admission_policy_binding,
    }
    for path in sorted(ADMISSION_DIR.glob("*.yaml")):
        for body in yaml.safe_load_all(path.read_text()):
            if body["kind"] not in deletes:
                continue
            try:
                await raw_json(
                    deletes[body["kind"]](body["metadata"]["name"], _preload_content=False)
                )
            except ApiError as error:
                if error.status != 404:  # gone already
                    raise


async def _read(admission: client.AdmissionregistrationV1Api, kind: str, name: str) -> str:
    reads: dict[str, Any] = {
        "MutatingWebhookConfiguration": admission.read_mutating_webhook_configuration,
        "ValidatingAdmissionPolicy": admission.read_validating_admission_policy,
        "ValidatingAdmissionPolicyBinding": admission.read_validating_admission_policy_binding,
    }
    found = await reads[kind](name)
    return str(found.metadata.resource_version)
