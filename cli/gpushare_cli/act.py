"""The one thing the CLI writes: `gpushare defrag --apply` carries a plan out, one move at a
time. Each move is an eviction through the Eviction API with the pod's UID as a precondition
(a pod replaced meanwhile is not touched); the next waits until the moved pod's controller
has a replacement bound. A refused eviction (a PodDisruptionBudget's 429, say) or a
replacement that does not come stops the run, saying where, with what was done kept.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from typing import cast

from kubernetes_asyncio import client

from gpushare import kube
from gpushare.kube import ApiError
from gpushare.model.bodies import Body, path, text
from gpushare.model.defrag import Move
from gpushare_cli.errors import CliError
from gpushare_cli.kubeconfig import Source, connect
from gpushare_cli.read import list_all

REPLACEMENT_TIMEOUT_S = 180.0


def controller_of(pod: Body) -> str | None:
    """The UID of the pod's controller (its owner with `controller: true`), if any."""
    for owner in path(pod, "metadata").get("ownerReferences") or ():
        if isinstance(owner, dict) and owner.get("controller") is True:
            return text(owner.get("uid"))
    return None


async def apply_moves(
    source: Source,
    moves: Sequence[Move],
    pods: Sequence[Body],
    say: Callable[[str], None],
) -> None:
    """Carry out `moves` in order; CliError when one cannot be."""
    owners = {text(path(p, "metadata").get("uid")): controller_of(p) for p in pods}
    async with await connect(source) as api:
        core = client.CoreV1Api(api)
        for number, move in enumerate(moves, 1):
            owner = owners.get(move.pod.uid)
            if owner is None:
                raise CliError(f"move {number}: pod {move.pod} has no controller to replace it")
            known = {
                text(path(p, "metadata").get("uid"))
                for p in await list_all(
                    functools.partial(core.list_namespaced_pod, move.pod.namespace)
                )
            }
            await _evict(core, move, number)
            say(f"move {number}/{len(moves)}: evicted {move.pod} from {move.node} card {move.card}")
            replacement = await _replacement(core, move, owner, known)
            say(f"  its replacement {replacement} is bound")


async def _evict(core: client.CoreV1Api, move: Move, number: int) -> None:
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": move.pod.name, "namespace": move.pod.namespace},
        "deleteOptions": {"preconditions": {"uid": move.pod.uid}},
    }
    try:
        await kube.raw_json(
            core.create_namespaced_pod_eviction(
                move.pod.name,
                move.pod.namespace,
                cast(client.V1Eviction, eviction),
                _preload_content=False,
            )
        )
    except ApiError as error:
        if error.status == 404:
            return  # gone already: its replacement is what the move waits for
        why = "a PodDisruptionBudget forbids it now" if error.status == 429 else error.message
        raise CliError(
            f"move {number}: evicting {move.pod} was refused ({error.status}: {why}); the "
            f"moves before it stand: run `gpushare defrag` again for a new plan"
        ) from error


async def _replacement(
    core: client.CoreV1Api, move: Move, owner: str, known: set[str | None]
) -> str:
    """The new pod of `owner`, once bound."""
    deadline = time.monotonic() + REPLACEMENT_TIMEOUT_S
    while time.monotonic() < deadline:
        listed = await list_all(functools.partial(core.list_namespaced_pod, move.pod.namespace))
        for pod in listed:
            meta = path(pod, "metadata")
            if text(meta.get("uid")) in known or controller_of(pod) != owner:
                continue
            if path(pod, "spec").get("nodeName"):
                return f"{meta.get('namespace')}/{meta.get('name')}"
        await asyncio.sleep(1.0)
    raise CliError(
        f"{move.pod} was evicted, but no replacement from its controller was bound within "
        f"{REPLACEMENT_TIMEOUT_S:.0f} s: see `gpushare explain` on its replacement"
    )
