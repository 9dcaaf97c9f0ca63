"""Installing the project's CustomResourceDefinitions (manifests/base/crds) into a cluster."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes_asyncio import client

from gpushare.kube import api_client

CRD_DIR = Path(__file__).resolve().parents[2] / "manifests" / "base" / "crds"


async def install_crds(api: client.ApiClient, *, timeout_s: float = 30.0) -> list[str]:
    """Create (or leave in place) every CRD under manifests/base/crds and wait until each is
    Established; returns their names."""
    extensions = client.ApiextensionsV1Api(api)
    names = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
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
