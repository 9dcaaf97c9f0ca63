"""A validating admission webhook of the test's own that answers some of the components'
writes with HTTP 500, as an apiserver whose admission chain or storage breaks answers them:
the components must retry, and lose nothing. The apiserver passes a webhook's refusal on with
the status code the webhook gives (500 here) and its message. Only the named users'
requests are sent to it (matchConditions), so the test's own calls pass untouched; it is
installed for the fault's time only (`install`, `remove`)."""

from __future__ import annotations

import base64
import datetime
import random
import ssl
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from aiohttp import web
from kubernetes_asyncio import client

from gpushare import certs
from gpushare.kube import raw_json

NAME = "campaign-internal-errors"
MESSAGE = "the test's webhook: an internal error, injected"


class FailingWebhook:
    def __init__(self, users: Sequence[str], *, share: float, seed: str) -> None:
        """`users`: whose writes it refuses; `share`: the fraction of them refused, drawn
        from `seed`."""
        self.users = list(users)
        self.share = share
        self.answered: Counter[str] = Counter()
        self._rng = random.Random(seed)  # noqa: S311  (replayable from the seed, no secret)
        self._ca = certs.new_ca("campaign-webhook-ca", valid=datetime.timedelta(days=1))
        self._runner: web.AppRunner | None = None
        self._port = 0

    async def start(self) -> None:
        """Serve HTTPS on a free loopback port."""
        served = certs.issue(
            self._ca, "127.0.0.1", hosts=["127.0.0.1"], valid=datetime.timedelta(days=1)
        )
        with tempfile.TemporaryDirectory() as folder:
            cert, key = Path(folder) / "tls.crt", Path(folder) / "tls.key"
            cert.write_bytes(served.cert)
            key.write_bytes(served.key)
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(cert, key)
        app = web.Application()
        app.router.add_post("/", self._review)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        self._port = int(self._runner.addresses[0][1])

    async def _review(self, request: web.Request) -> web.Response:
        review = await request.json()
        refused = self._rng.random() < self.share
        self.answered["refused" if refused else "allowed"] += 1
        answer: dict[str, Any] = {"uid": review["request"]["uid"], "allowed": not refused}
        if refused:
            answer["status"] = {"code": 500, "reason": "InternalError", "message": MESSAGE}
        return web.json_response(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": answer}
        )

    def configuration(self) -> dict[str, Any]:
        """Every write of `users`, on any resource and subresource, sent here."""
        users = ", ".join(f"'{user}'" for user in self.users)
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": NAME},
            "webhooks": [
                {
                    "name": "internal-errors.campaign.gpushare.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{self._port}/",
                        "caBundle": base64.b64encode(self._ca.cert).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": ["*"],
                            "apiVersions": ["*"],
                            "operations": ["CREATE", "UPDATE", "DELETE"],
                            "resources": ["*/*"],
                            "scope": "*",
                        }
                    ],
                    "matchConditions": [
                        {
                            "name": "components",
                            "expression": f"request.userInfo.username in [{users}]",
                        }
                    ],
                }
            ],
        }

    async def install(self, api: client.ApiClient) -> None:
        body = cast(client.V1ValidatingWebhookConfiguration, self.configuration())
        admission = client.AdmissionregistrationV1Api(api)
        await raw_json(
            admission.create_validating_webhook_configuration(body, _preload_content=False)
        )

    async def remove(self, api: client.ApiClient) -> None:
        admission = client.AdmissionregistrationV1Api(api)
        await raw_json(
            admission.delete_validating_webhook_configuration(NAME, _preload_content=False)
        )

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
