"""The frameworks' limits given with a share of a card, and how they merge with a pod's own."""

from __future__ import annotations

from builders import gpu_pod, gpunode_resource

from gpushare.model import contract
from gpushare.model.allocation import match_container
from gpushare.model.bound import bound_pod
from gpushare.model.inventory import NodeName, inventory_from_spec
from gpushare.model.limits import LimitSettings, framework_limits
from gpushare.model.request import GpuKind

H200_MIB = 143771


def test_the_share_less_one_cuda_context_is_the_allocators_fraction_of_the_card() -> None:
    given = framework_limits(1024, H200_MIB, LimitSettings())
    # (1024 - 512) / 143771, rounded down: never more than the grant.
    assert given.env == {
        contract.ENV_PYTORCH_ALLOC_CONF: "per_process_memory_fraction:0.003561",
        contract.ENV_JAX_MEM_FRACTION: "0.003561",
        contract.ENV_TF_ALLOW_GROWTH: "true",
    }
    assert given.kept == ()
    assert given.note is None


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
    given = framework_limits(2048, H200_MIB, LimitSettings(), own=own)
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
        limits=LimitSettings(),
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
