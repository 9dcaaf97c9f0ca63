"""Whatever a manifest holds, the model answers or raises its own typed error, never a
KeyError, TypeError or ValueError."""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.model import (
    GpuShareError,
    Ledger,
    claim_of,
    contract,
    gpu_request,
    node_inventory,
    parse_card_indices,
    parse_quantity,
)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["1024", "1.5", "-1", "abc", "1Gi", "10^12", "2k", "1e3", "0", " 1", "0,,1"]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
KEYS = st.sampled_from([contract.GPU_MEMORY, contract.GPU_NUMBER, "cpu"])


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    def container() -> Any:
        return draw(
            st.one_of(
                JSON,
                st.fixed_dictionaries(
                    {
                        "name": JSON,
                        "restartPolicy": st.one_of(st.just("Always"), JSON),
                        "resources": st.one_of(
                            JSON,
                            st.fixed_dictionaries(
                                {
                                    "limits": st.one_of(JSON, st.dictionaries(KEYS, SCALARS)),
                                    "requests": st.one_of(JSON, st.dictionaries(KEYS, SCALARS)),
                                }
                            ),
                        ),
                    }
                ),
            )
        )

    return {
        "metadata": draw(
            st.one_of(
                JSON,
                st.fixed_dictionaries(
                    {
                        "name": JSON,
                        "namespace": JSON,
                        "uid": JSON,
                        "annotations": st.one_of(
                            JSON,
                            st.dictionaries(st.sampled_from([contract.GPU_INDEX, "x"]), SCALARS),
                        ),
                    }
                ),
            )
        ),
        "spec": draw(
            st.one_of(
                JSON,
                st.fixed_dictionaries(
                    {
                        "nodeName": st.one_of(st.just("gpu-1"), JSON),
                        "containers": st.lists(st.builds(container), max_size=3),
                        "initContainers": st.one_of(
                            JSON, st.lists(st.builds(container), max_size=2)
                        ),
                    }
                ),
            )
        ),
        "status": draw(st.one_of(JSON, st.fixed_dictionaries({"phase": JSON}))),
    }


@st.composite
def nodes(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any] | None]:
    node = {
        "metadata": {
            "name": draw(st.one_of(st.just("gpu-1"), JSON)),
            "annotations": draw(
                st.one_of(JSON, st.dictionaries(st.just(contract.GPU_UNHEALTHY_IDS), SCALARS))
            ),
        },
        "status": {"capacity": draw(st.one_of(JSON, st.dictionaries(KEYS, SCALARS)))},
    }
    card = st.fixed_dictionaries(
        {
            "index": SCALARS,
            "uuid": SCALARS,
            "memoryMiB": SCALARS,
            "health": st.one_of(st.just("Healthy"), SCALARS),
        }
    )
    resource = draw(
        st.one_of(
            st.none(),
            JSON.map(lambda spec: {"spec": spec}),
            st.builds(
                lambda cards, unit: {"spec": {"cards": cards, "memoryUnitMiB": unit}},
                st.lists(card, max_size=3),
                SCALARS,
            ),
        )
    )
    return node, resource


@settings(max_examples=250, deadline=None)
@given(pod=pods())
def test_pods_give_a_request_or_a_typed_error(pod: dict[str, Any]) -> None:
    try:
        request = gpu_request(pod)
    except GpuShareError:
        pass
    else:
        assert request.total >= 0
    claim = claim_of(pod)  # never raises: problems are reported, not thrown
    if claim.allocation is not None:
        assert claim.allocation.amount > 0


@settings(max_examples=250, deadline=None)
@given(node_and_resource=nodes(), pod=pods())
def test_nodes_give_an_inventory_or_a_typed_error(
    node_and_resource: tuple[dict[str, Any], dict[str, Any] | None], pod: dict[str, Any]
) -> None:
    node, resource = node_and_resource
    try:
        inventory = node_inventory(node, resource)
    except GpuShareError:
        return
    if inventory is None:
        return
    assert all(card.memory >= 0 for card in inventory.cards)
    ledger = Ledger()
    ledger.set_node(inventory)
    claim = claim_of(pod)
    if claim.allocation is not None:
        ledger.add(claim.allocation)
    usage = ledger.node(inventory.node)
    assert usage is not None
    assert usage.free >= 0
    assert all(card.free >= 0 for card in usage.cards.values())


@given(value=SCALARS)
def test_quantities_and_indices_fail_only_with_typed_errors(value: object) -> None:
    with contextlib.suppress(GpuShareError):
        parse_quantity(value, resource=contract.GPU_MEMORY, owner="x")
    if isinstance(value, str):
        with contextlib.suppress(GpuShareError):
            parse_card_indices(value, key=contract.GPU_INDEX, owner="x")
