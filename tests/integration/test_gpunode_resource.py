"""The GPUNode resource in a real apiserver: its schema refuses bad specs, and the model
builds heterogeneous cards from what the apiserver stores."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio import client

from gpushare.kube import ApiError, raw_json
from gpushare.model import GpuKind, Ledger, Placement, PodRequest, contract, node_inventory, place
from gpushare_harness import FakeGpuNode, create_gpu_node
from gpushare_harness.crds import install_crds

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def gpunode(name: str, cards: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": f"{contract.INVENTORY_GROUP}/{contract.INVENTORY_VERSION}",
        "kind": contract.INVENTORY_KIND,
        "metadata": {"name": name},
        "spec": {"pluginVersion": "test", "cards": cards},
    }


async def create(api: client.ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    objects = client.CustomObjectsApi(api)
    return await raw_json(
        objects.create_cluster_custom_object(
            contract.INVENTORY_GROUP,
            contract.INVENTORY_VERSION,
            contract.INVENTORY_PLURAL,
            body,
            _preload_content=False,
        )
    )


async def test_heterogeneous_cards_come_from_the_stored_resource(
    api_client: client.ApiClient, core: client.CoreV1Api, unique: str
) -> None:
    await install_crds(api_client)
    name = f"mixed-{unique}"
    node = await create_gpu_node(core, FakeGpuNode(name=name, gpu_memory=122519, gpu_number=2))
    stored = await create(
        api_client,
        gpunode(
            name,
            [
                {
                    "index": 0,
                    "uuid": "GPU-aaaa",
                    "model": "NVIDIA H100 80GB HBM3",
                    "memoryMiB": 81559,
                },
                {
                    "index": 1,
                    "uuid": "GPU-bbbb",
                    "model": "NVIDIA A100-PCIE-40GB",
                    "memoryMiB": 40960,
                },
            ],
        ),
    )
    # The schema's defaults are applied by the apiserver.
    assert stored["spec"]["memoryUnitMiB"] == 1
    assert {c["health"] for c in stored["spec"]["cards"]} == {"Healthy"}

    inventory = node_inventory(node, stored)
    assert inventory is not None
    assert [(c.memory, c.model) for c in inventory.cards] == [
        (81559, "NVIDIA H100 80GB HBM3"),
        (40960, "NVIDIA A100-PCIE-40GB"),
    ]
    ledger = Ledger()
    ledger.set_node(inventory)
    placement = place(ledger, PodRequest(kind=GpuKind.MEMORY, total=30000, containers=()))
    assert isinstance(placement, Placement)
    assert placement.cards == (1,)  # the 40 GiB card is the tighter fit


@pytest.mark.parametrize(
    ("card", "field"),
    [
        ({"index": 0, "memoryMiB": 1024}, "uuid"),
        ({"index": 0, "uuid": "GPU-x", "memoryMiB": 0}, "memoryMiB"),
        ({"index": -1, "uuid": "GPU-x", "memoryMiB": 1024}, "index"),
        ({"index": 0, "uuid": "GPU-x", "memoryMiB": 1024, "health": "Broken"}, "health"),
    ],
    ids=["missing uuid", "zero memory", "negative index", "unknown health"],
)
async def test_the_schema_refuses_bad_cards_naming_the_field(
    api_client: client.ApiClient, unique: str, card: dict[str, Any], field: str
) -> None:
    await install_crds(api_client)
    with pytest.raises(ApiError) as caught:
        await create(api_client, gpunode(f"bad-{unique}", [card]))
    assert caught.value.status == 422
    assert field in caught.value.message


async def test_the_schema_refuses_a_card_index_listed_twice(
    api_client: client.ApiClient, unique: str
) -> None:
    await install_crds(api_client)
    cards = [{"index": 0, "uuid": f"GPU-{n}", "memoryMiB": 1024} for n in range(2)]
    with pytest.raises(ApiError) as caught:
        await create(api_client, gpunode(f"dup-{unique}", cards))
    assert caught.value.status == 422
    assert "Duplicate value" in caught.value.message


async def test_the_schema_refuses_a_device_list_strategy_no_plugin_has(
    api_client: client.ApiClient, unique: str
) -> None:
    await install_crds(api_client)
    body = gpunode(f"strategy-{unique}", [{"index": 0, "uuid": "GPU-x", "memoryMiB": 1024}])
    body["spec"]["deviceListStrategy"] = "env"
    with pytest.raises(ApiError) as caught:
        await create(api_client, body)
    assert caught.value.status == 422
    assert 'spec.deviceListStrategy: Unsupported value: "env"' in caught.value.message
