"""The frameworks' own memory limits, given with a share of a card: pure, no I/O.

Nothing on the card stops a process from allocating past its share (HAMi-core, the CUDA
interception the peers use, enforces nothing on CUDA 13: docs/memory.md). The
frameworks do, when told through their environment, so the device plugin tells each container
that shares a card:

- PyTorch: `PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:F`; its caching allocator
  refuses to reserve more than F of the card (`OutOfMemoryError ... allowed`).
- JAX: `XLA_PYTHON_CLIENT_MEM_FRACTION=F`; it preallocates F of the card, and no more.
- TensorFlow: `TF_FORCE_GPU_ALLOW_GROWTH=true`; it grows as it needs instead of taking
  nearly the whole card at start (its fraction is no environment setting).
- Where the node runs MPS: `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M`, which the MPS server
  enforces for every client (device 0: the one card the container sees).

The CUDA context. A process's context holds memory outside any allocator: about 0.5 GiB on
an H200 with CUDA 13 (a process holding a 3 GiB tensor showed 3,590 MiB in NVML). The grant
covers all a process holds on the card, as NVML counts it and as the neighbours lose it, so
the allocators are given the grant less one context (`context_mib`): F = (grant - context) /
card. A grant no larger than a context gets F = grant / card, and is told so in the log: a
CUDA process cannot stay within it.

A pod's own value wins: the kubelet puts a container's own env after what a device plugin
returns, so a variable the container sets is not given, and the plugin reports it. Whole-card
containers get none (the card is theirs); a pod annotated `gpushare.io/framework-limits: off`
gets none.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

from gpushare.model import contract

DEFAULT_CONTEXT_MIB = 512


@dataclass(frozen=True, kw_only=True, slots=True)
class LimitSettings:
    """How a node's device plugin gives the frameworks' limits."""

    context_mib: int = DEFAULT_CONTEXT_MIB
    """Memory a CUDA context holds outside the allocators, left out of their fraction."""
    mps: bool = False
    """The node runs the MPS control daemon: give its pinned-memory limit too."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What a container is given, and what it keeps of its own."""

    env: Mapping[str, str]
    kept: tuple[str, ...] = ()
    """The frameworks' variables the container sets itself: its values win (reported)."""
    note: str | None = None
    """Something worth a log line (a grant smaller than a CUDA context)."""


NONE = Limits(env={})


def framework_limits(
    allocated_mib: int,
    card_mib: int,
    settings: LimitSettings,
    *,
    own: Set[str] = frozenset(),
) -> Limits:
    """The limits for a container granted `allocated_mib` of a card of `card_mib`; `own`: the
    names the container sets in its env itself."""
    usable = allocated_mib - settings.context_mib
    note = None
    if usable <= 0:
        usable = allocated_mib
        note = (
            f"a grant of {allocated_mib} MiB is no larger than a CUDA context "
            f"({settings.context_mib} MiB): a CUDA process cannot stay within it"
        )
    fraction = _fraction(usable, card_mib)
    given = {
        contract.ENV_PYTORCH_ALLOC_CONF: f"per_process_memory_fraction:{fraction}",
        contract.ENV_JAX_MEM_FRACTION: fraction,
        contract.ENV_TF_ALLOW_GROWTH: "true",
    }
    if settings.mps:
        given[contract.ENV_MPS_MEM_LIMIT] = f"0={allocated_mib}M"
    kept = tuple(name for name in given if name in own)
    env = {name: value for name, value in given.items() if name not in own}
    return Limits(env=env, kept=kept, note=note)


def wanted(annotations: Mapping[str, str]) -> bool:
    """Whether a pod takes the frameworks' limits (not annotated `framework-limits: off`)."""
    return annotations.get(contract.FRAMEWORK_LIMITS) != contract.FRAMEWORK_LIMITS_OFF


def _fraction(mib: int, card_mib: int) -> str:
    """`mib` of the card as a fraction, rounded down (never more than granted), written with
    enough digits to keep a MiB on a card of 141 GiB."""
    places = 6
    scale = 10**places
    value = max(1, (mib * scale) // card_mib) if card_mib > 0 else scale
    return f"{value / scale:.{places}f}"
