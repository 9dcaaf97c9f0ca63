"""Creating pods through the admission chain, as `kubectl create` would."""

from __future__ import annotations

from typing import Any, cast

import pytest
from cluster import create_pod, eventually, gpu_pod
from kubernetes_asyncio import client

from gpushare.kube import ApiError, raw_json
from gpushare.model import contract

NOT_ADMITTED = "no gpushare-operator replica answered"
"""What the policy says of a GPU pod the admission webhook did not answer for."""


async def create(core: client.CoreV1Api, body: dict[str, Any]) -> dict[str, Any]:
    """Create a pod, retrying while the apiserver has not yet loaded the policy or the
    webhook's caBundle (both reach its admission chain a moment after they are written)."""

    async def created() -> dict[str, Any] | None:
        try:
            return await create_pod(core, body)
        except ApiError as error:
            # The webhook is skipped (failurePolicy Ignore) until the operator has set the
            # caBundle: the policy then refuses the pod as not admitted.
            if any(m in error.message for m in ("x509", "not yet synced", NOT_ADMITTED)):
                return None
            raise

    return await eventually(created, timeout_s=20, what=f"pod {body['metadata']['name']}")


async def refusal(core: client.CoreV1Api, body: dict[str, Any]) -> str:
    with pytest.raises(ApiError) as refused:
        await create_pod(core, body)
    return refused.value.message


async def ready(core: client.CoreV1Api) -> None:
    """The webhook answers with a trusted certificate (the operator has set the caBundle) and
    the policy is in force (the apiserver loads it a moment after it is written, apart from
    the webhook: a pod created before then passes unchecked)."""
    probe = gpu_pod("probe", 1024, nodeSelector={"none": "none"})
    await create(core, probe)
    await core.delete_namespaced_pod("probe", "default", grace_period_seconds=0)

    async def policy_refuses() -> bool:
        try:
            await raw_json(
                core.create_namespaced_pod(
                    "default",
                    cast(client.V1Pod, gpu_pod("policy-probe", 1024, nodeName="none")),
                    dry_run="All",
                    _preload_content=False,
                )
            )
        except ApiError as error:
            return "spec.nodeName" in error.message
        return False

    await eventually(policy_refuses, timeout_s=20, what="the admission policy in force")


def limit(pod: dict[str, Any], index: int = 0) -> str:
    return str(pod["spec"]["containers"][index]["resources"]["limits"][contract.GPU_MEMORY])
