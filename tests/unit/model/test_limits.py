"""The frameworks' limits given with a share of a card, and how they merge with a pod's own."""

from __future__ import annotations

import pytest
from builders import gpu_pod, gpunode_resource

from gpushare.model import contract
from gpushare.model.allocation import match_container
from gpushare.model.bound import bound_pod
from gpushare.model.inventory import NodeName, inventory_from_spec
from gpushare.model.limits import (
    DEFAULT_FRAMEWORKS,
    Framework,
    LimitSettings,
    framework_limits,
    frameworks_named,
)
from gpushare.model.request import GpuKind

H200_MIB = 143771
EVERY = LimitSettings(frameworks=frozenset(Framework))


def test_the_share_less_one_cuda_context_is_the_allocators_fraction_of_the_card() -> None:
    given = framework_limits(1024, H200_MIB, EVERY)
    # (1024 - 512) / 143771, rounded down: never more than the grant.
    assert given.env == {
        contract.ENV_PYTORCH_ALLOC_CONF: "per_process_memory_fraction:0.003561",
        contract.ENV_JAX_MEM_FRACTION: "0.003561",
        contract.ENV_TF_ALLOW_GROWTH: "true",
    }
    assert given.kept == ()
    assert given.note is None


def test_pytorch_is_given_its_limit_only_where_asked() -> None:
    # PyTorch before 2.9 fails at its first CUDA allocation on an option it does not know.
    assert {Framework.JAX, Framework.TENSORFLOW} == DEFAULT_FRAMEWORKS
    by_default = framework_limits(1024, H200_MIB, LimitSettings())
    assert set(by_default.env) == {contract.ENV_JAX_MEM_FRACTION, contract.ENV_TF_ALLOW_GROWTH}
    asked = framework_limits(
        1024, H200_MIB, LimitSettings(), frameworks=frozenset({Framework.PYTORCH})
    )
    assert set(asked.env) == {contract.ENV_PYTORCH_ALLOC_CONF}


def test_on_an_mps_node_a_pod_cannot_turn_the_mps_limit_off() -> None:
    given = framework_limits(4096, H200_MIB, LimitSettings(mps=True), frameworks=frozenset())
    assert given.env == {contract.ENV_MPS_MEM_LIMIT: "0=4096M"}


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ("off", set()),
        ("none", set()),
        ("all", {"pytorch", "jax", "tensorflow"}),
        ("PyTorch, jax", {"pytorch", "jax"}),
        ("tensorflow", {"tensorflow"}),
    ],
)
def test_frameworks_are_named_by_a_comma_list(raw: str, named: set[str]) -> None:
    assert frameworks_named(raw) == named


def test_a_framework_nobody_limits_is_refused_with_the_names_that_are() -> None:
    with pytest.raises(ValueError, match=r"torch.*comma list of pytorch, jax, tensorflow"):
        frameworks_named("torch,jax")


def test_a_grant_no_larger_than_a_context_is_given_whole_and_said() -> None:
    given = framework_limits(512, H200_MIB, LimitSettings())
    assert given.env[contract.ENV_JAX_MEM_FRACTION] == "0.003561"
    assert given.note is not None
    assert "no larger than a CUDA context" in given.note


def test_on_an_mps_node_the_pinned_limit_is_the_whole_grant() -> None:
    given = framework_limits(4096, H200_MIB, LimitSettings(mps=True))
    assert given.env[contract.ENV_MPS_MEM_LIMIT] == "0=4096M"


def test_a_variable_the_container_sets_itself_is_its_own_and_reported() -> None:
    own = frozenset({contract.ENV_PYTORCH_ALLOC_CONF, "HOME"})
    given = framework_limits(2048, H200_MIB, EVERY, own=own)
    assert contract.ENV_PYTORCH_ALLOC_CONF not in given.env
    assert contract.ENV_JAX_MEM_FRACTION in given.env
    assert given.kept == (contract.ENV_PYTORCH_ALLOC_CONF,)


def inventory() -> object:
    spec = gpunode_resource("n", [11178, 11178])["spec"]
    found = inventory_from_spec(NodeName("n"), spec)
    assert found is not None
    return found


def served(pod: dict[str, object], kind: GpuKind, count: int) -> dict[str, str]:
    grant = match_container(
        [bound_pod(pod)],
        {},
        kind=kind,
        count=count,
        inventory=inventory(),  # type: ignore[arg-type]
        limits=EVERY,
    )
    return grant.env


def test_allocate_gives_a_shared_card_its_limits_and_whole_cards_none() -> None:
    shared = gpu_pod("shared", 2048, node="n", index="0", uid="shared")
    env = served(shared, GpuKind.MEMORY, 2048)
    assert env[contract.ENV_PYTORCH_ALLOC_CONF] == "per_process_memory_fraction:0.137412"
    whole = gpu_pod("whole", number=1, node="n", index="1", uid="whole")
    assert contract.ENV_PYTORCH_ALLOC_CONF not in served(whole, GpuKind.NUMBER, 1)


def test_a_pod_may_opt_out_and_a_containers_own_value_is_not_given() -> None:
    out = gpu_pod("out", 2048, node="n", index="0", uid="out")
    out["metadata"]["annotations"][contract.FRAMEWORK_LIMITS] = "off"
    assert set(served(out, GpuKind.MEMORY, 2048)) == {
        contract.ENV_VISIBLE_DEVICES,
        contract.ENV_GPU_ALLOCATED,
        contract.ENV_GPU_MEMORY_TOTAL,
    }
    own = gpu_pod("own", 2048, node="n", index="0", uid="own")
    own["spec"]["containers"][0]["env"] = [
        {"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": ".9"}
    ]
    env = served(own, GpuKind.MEMORY, 2048)
    assert contract.ENV_JAX_MEM_FRACTION not in env
    assert contract.ENV_PYTORCH_ALLOC_CONF in env


def test_a_pod_names_the_frameworks_it_takes_limits_for() -> None:
    pod = gpu_pod("jax-only", 2048, node="n", index="0", uid="jax-only")
    pod["metadata"]["annotations"][contract.FRAMEWORK_LIMITS] = "jax"
    env = served(pod, GpuKind.MEMORY, 2048)
    assert contract.ENV_JAX_MEM_FRACTION in env
    assert contract.ENV_PYTORCH_ALLOC_CONF not in env
    assert contract.ENV_TF_ALLOW_GROWTH not in env
