"""The admission webhook on a certificate another issuer keeps (the chart's
webhook.certManager): the operator serves the files of a mounted folder
(GPUSHARE_WEBHOOK_CERT_DIR), makes no Secret of its own and leaves the caBundle to that
issuer, which this test plays (cert-manager's cainjector sets it from the Certificate)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest
from admitting import create, limit, ready
from cluster import gpu_pod
from kubernetes_asyncio import client

from gpushare.kube import ApiError, raw_json
from gpushare_operator.webhook import CA_KEY, issue

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_the_operator_serves_a_mounted_certificate_and_leaves_the_ca_bundle_alone(
    api: client.ApiClient,
    core: client.CoreV1Api,
    operators: Any,
    admission: None,
    tmp_path: Path,
) -> None:
    mounted = tmp_path / "webhook-tls"
    mounted.mkdir()
    bundle = issue({"127.0.0.1"})
    for key, value in bundle.items():
        (mounted / key).write_bytes(value)
    ca_bundle = base64.b64encode(bundle[CA_KEY]).decode()
    admission_api = client.AdmissionregistrationV1Api(api)
    patch = [
        {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": ca_bundle},
    ]
    await raw_json(
        admission_api.patch_mutating_webhook_configuration(
            "gpushare",
            patch,
            _content_type="application/json-patch+json",  # type: ignore[call-arg]
            _preload_content=False,
        )
    )
    operator = operators(GPUSHARE_WEBHOOK_CERT_DIR=str(mounted))
    await ready(core)
    created = await create(core, gpu_pod("converted", 1024, nodeSelector={"none": "none"}))
    assert limit(created) == "2"

    # Decided at startup, before the webhook served the pod above: no caBundle of its own.
    await asyncio.to_thread(operator.wait_logged, "webhook_certificate_mounted", timeout_s=5)
    configuration = await raw_json(
        admission_api.read_mutating_webhook_configuration("gpushare", _preload_content=False)
    )
    assert configuration["webhooks"][0]["clientConfig"]["caBundle"] == ca_bundle
    with pytest.raises(ApiError) as missing:
        await raw_json(
            core.read_namespaced_secret(
                "gpushare-webhook-tls", "gpushare-system", _preload_content=False
            )
        )
    assert missing.value.status == 404
