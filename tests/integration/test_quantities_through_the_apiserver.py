"""Quantities as the apiserver returns them: canonical forms the model must read."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from gpushare.kube import ApiError, raw_json
from gpushare.model import InvalidQuantity, contract, gpu_request

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def create_pod(
    core: client.CoreV1Api, namespace: str, name: str, limit: str
) -> dict[str, Any]:
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            scheduler_name="volcano",
            containers=[
                client.V1Container(
                    name="c",
                    image="busybox",
                    resources=client.V1ResourceRequirements(limits={contract.GPU_MEMORY: limit}),
                )
            ],
        ),
    )
    return await raw_json(core.create_namespaced_pod(namespace, pod, _preload_content=False))


@pytest.mark.parametrize(
    ("written", "stored", "units"),
    [("2000", "2k", 2000), ("11178", "11178", 11178), ("1e3", "1e3", 1000)],
)
async def test_canonical_forms_read_back_as_the_number_written(
    core: client.CoreV1Api, namespace: str, written: str, stored: str, units: int
) -> None:
    pod = await create_pod(core, namespace, f"q-{units}", written)
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits[contract.GPU_MEMORY] == stored
    assert gpu_request(pod).total == units


async def test_binary_suffixes_pass_the_apiserver_but_not_the_model(
    core: client.CoreV1Api, namespace: str
) -> None:
    pod = await create_pod(core, namespace, "gib", "1Gi")
    with pytest.raises(InvalidQuantity, match="binary suffix"):
        gpu_request(pod)


async def test_fractions_are_refused_by_the_apiserver_itself(
    core: client.CoreV1Api, namespace: str
) -> None:
    with pytest.raises(ApiError) as caught:
        await create_pod(core, namespace, "half", "1.5")
    assert caught.value.status == 422
