"""The frameworks' own memory limits, given with a share of a card: pure, no I/O.

Nothing on the card stops a process from allocating past its share (HAMi-core, the CUDA
interception the peers use, enforces nothing on CUDA 13: docs/memory.md). The
frameworks do, when told through their environment, so the device plugin tells each container
that shares a card:

- PyTorch (2.9 and later): `PYTORCH_CUDA_ALLOC_CONF=per_process_memory_fraction:F`; its
  caching allocator refuses to reserve more than F of the card (`OutOfMemoryError ... allowed`).
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

Which frameworks: the node's default (`--framework-limits`, JAX and TensorFlow unless the admin
adds PyTorch), or what the pod names in `gpushare.io/framework-limits` (a comma list of
`pytorch`, `jax`, `tensorflow`, or `off`). PyTorch is not in the default: its caching allocator
reads `per_process_memory_fraction` from release 2.9 on, and earlier releases refuse an option
they do not know at their first CUDA allocation (`RuntimeError: Unrecognized CachingAllocator
option`), so a pod written for Volcano with an older PyTorch would stop working. The MPS limit
is no framework's: on an MPS node every container that shares a card gets it, whatever the
pod names. The MPS server enforces the limit its client's environment names, so it is as
strong as that environment: the gpushare-gpu-env policy refuses it in a container's `env`,
but a process may still set its own (a shell, `envFrom`); measurement is the backstop.

A pod's own value wins: the kubelet puts a container's own env after what a device plugin
returns, so a variable the container sets is not given, and the plugin reports it
(`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` the gpushare-gpu-env policy refuses in `env`). Whole-card
containers get none (the card is theirs).
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from enum import StrEnum

from gpushare.model import contract

DEFAULT_CONTEXT_MIB = 512


class Framework(StrEnum):
    PYTORCH = "pytorch"
    JAX = "jax"
    TENSORFLOW = "tensorflow"


DEFAULT_FRAMEWORKS: frozenset[Framework] = frozenset({Framework.JAX, Framework.TENSORFLOW})
"""Given unless the node or the pod says otherwise: PyTorch only where asked (above)."""


_NONE = ("off", "none")
_ALL = "all"


def frameworks_named(raw: str) -> frozenset[Framework]:
    """The frameworks a comma list names, or `off` (`none`) for none, `all` for every one;
    ValueError naming the valid words otherwise (an empty list too: a typo's likely form)."""
    words = {word.strip().lower() for word in raw.split(",") if word.strip()}
    if len(words) == 1 and words <= {*_NONE, _ALL}:
        return frozenset(Framework) if words == {_ALL} else frozenset()
    if not words or words & {*_NONE, _ALL}:
        raise ValueError(
            f"{raw!r} is no list of frameworks: give a comma list of {', '.join(Framework)}, "
            f"or all alone, or off alone"
        )
    unknown = sorted(words - set(Framework))
    if unknown:
        raise ValueError(
            f"gpushare gives no framework named {', '.join(unknown)} a memory limit: "
            f"give a comma list of {', '.join(Framework)}, or all, or off"
        )
    return frozenset(Framework(word) for word in words)


@dataclass(frozen=True, kw_only=True, slots=True)
class LimitSettings:
    """How a node's device plugin gives the frameworks' limits."""

    frameworks: frozenset[Framework] = DEFAULT_FRAMEWORKS
    """The frameworks given a limit unless a pod names its own (`--framework-limits`)."""
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
    frameworks: frozenset[Framework] | None = None,
) -> Limits:
    """The limits for a container granted `allocated_mib` of a card of `card_mib`; `own`: the
    names the container sets in its env itself; `frameworks`: those its pod names (None: the
    node's)."""
    usable = allocated_mib - settings.context_mib
    note = None
    if usable <= 0:
        usable = allocated_mib
        note = (
            f"a grant of {allocated_mib} MiB is no larger than a CUDA context "
            f"({settings.context_mib} MiB): a CUDA process cannot stay within it"
        )
    fraction = _fraction(usable, card_mib)
    chosen = settings.frameworks if frameworks is None else frameworks
    given = {
        name: value
        for framework, name, value in (
            (
                Framework.PYTORCH,
                contract.ENV_PYTORCH_ALLOC_CONF,
                f"per_process_memory_fraction:{fraction}",
            ),
            (Framework.JAX, contract.ENV_JAX_MEM_FRACTION, fraction),
            (Framework.TENSORFLOW, contract.ENV_TF_ALLOW_GROWTH, "true"),
        )
        if framework in chosen
    }
    if settings.mps:
        given[contract.ENV_MPS_MEM_LIMIT] = f"0={allocated_mib}M"
    kept = tuple(name for name in given if name in own)
    env = {name: value for name, value in given.items() if name not in own}
    return Limits(env=env, kept=kept, note=note)


def pod_frameworks(annotations: Mapping[str, str]) -> frozenset[Framework] | None:
    """The frameworks a pod names in `gpushare.io/framework-limits`; None when it names none,
    or names them wrong (the admission webhook refuses that at creation; a pod created while it
    did not run takes the node's)."""
    raw = annotations.get(contract.FRAMEWORK_LIMITS)
    if raw is None:
        return None
    try:
        return frameworks_named(raw)
    except ValueError:
        return None


def _fraction(mib: int, card_mib: int) -> str:
    """`mib` of the card as a fraction, rounded down (never more than granted), written with
    enough digits to keep a MiB on a card of 141 GiB."""
    places = 6
    scale = 10**places
    value = max(1, (mib * scale) // card_mib) if card_mib > 0 else scale
    return f"{value / scale:.{places}f}"
