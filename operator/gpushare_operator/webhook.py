"""The admission webhook's serving certificate, shared by every replica, and the caBundle of
the MutatingWebhookConfiguration that calls it.

The first replica to start makes a CA and a serving certificate for the webhook's names and
stores them in a Secret; the others, and later restarts, read it, so whichever replica the
Service picks answers with a certificate the apiserver trusts. Every replica keeps the
configuration's caBundle equal to that CA, checked again every minute (a `kubectl apply` or a
chart upgrade may reset it). A Secret made for other names is replaced.

With `webhook_cert_dir` set, another issuer (cert-manager, through a mounted Secret) owns
the certificate: `mounted_serving_files` hands its files to the server as they are (kopf's
server reads them again when they change, so a renewal needs no restart), and that issuer
(cert-manager's cainjector) keeps the caBundle: no Secret is made and nothing is patched.

The webhook itself is the model's `admit` with the live configuration, served by kopf
(`handlers.gpu_pod_admission`).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpushare import certs, logs
from gpushare.kube import ApiError
from gpushare.kube.retry import PUBLISH
from gpushare_operator.config import OperatorConfig
from gpushare_operator.kubeapi import KubeSchedulerApi

CA_KEY = "ca.crt"
CERT_KEY = "tls.crt"
KEY_KEY = "tls.key"
HOSTS_ANNOTATION = "gpushare.io/webhook-hosts"
_VALID = datetime.timedelta(days=3650)
CHECK_INTERVAL_S = 60.0
MISSING_CHECK_INTERVAL_S = 5.0

log = logs.get("webhook")


@dataclass(frozen=True, slots=True)
class ServingFiles:
    certfile: Path
    keyfile: Path
    ca_pem: bytes


def issue(hosts: Iterable[str]) -> dict[str, bytes]:
    """A CA and a serving certificate for `hosts` (DNS names or IPs), PEM encoded."""
    names = sorted(hosts)
    ca = certs.new_ca("gpushare-webhook-ca", valid=_VALID)
    serving = certs.issue(ca, names[0], hosts=names, valid=_VALID)
    return {CA_KEY: ca.cert, CERT_KEY: serving.cert, KEY_KEY: serving.key}


def _hosts_value(hosts: Iterable[str]) -> str:
    return ",".join(sorted(hosts))


async def shared_certificate(api: KubeSchedulerApi, config: OperatorConfig) -> dict[str, bytes]:
    """The Secret's CA and serving certificate, made first if absent or made for other names."""
    namespace, name = config.lease_namespace, config.webhook_secret
    wanted = _hosts_value(config.webhook_hosts)
    for backoff in PUBLISH.delays():
        secret = await api.read_secret(namespace, name)
        annotations = (secret or {}).get("metadata", {}).get("annotations") or {}
        data = (secret or {}).get("data") or {}
        keys = (CA_KEY, CERT_KEY, KEY_KEY)
        if annotations.get(HOSTS_ANNOTATION) == wanted and all(key in data for key in keys):
            return {key: base64.b64decode(data[key]) for key in (CA_KEY, CERT_KEY, KEY_KEY)}
        if secret is not None:
            # Made for other names (or damaged): replace it. Every replica of one version
            # asks for the same names, so this settles on one certificate.
            await api.delete_secret(namespace, name, secret["metadata"].get("uid"))
        issued = issue(config.webhook_hosts)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": name, "annotations": {HOSTS_ANNOTATION: wanted}},
            "data": {key: base64.b64encode(value).decode() for key, value in issued.items()},
        }
        try:
            await api.create_secret(namespace, body)
        except ApiError as error:
            if error.status != 409:
                raise
            await asyncio.sleep(backoff)
            continue  # another replica made it first: read theirs
        log.info("webhook_certificate_created", secret=f"{namespace}/{name}", hosts=wanted)
        return issued
    raise AssertionError("unreachable: delays() never ends")


def write_serving_files(bundle: dict[str, bytes]) -> ServingFiles:
    """The certificate and key in a private folder for the HTTPS server (removed at exit
    with the process's temporary folder)."""
    directory = Path(tempfile.mkdtemp(prefix="gpushare-webhook-"))
    certfile, keyfile = directory / CERT_KEY, directory / KEY_KEY
    certfile.write_bytes(bundle[CERT_KEY])
    keyfile.touch(mode=0o600)
    keyfile.write_bytes(bundle[KEY_KEY])
    return ServingFiles(certfile=certfile, keyfile=keyfile, ca_pem=bundle[CA_KEY])


class CertificateMissing(Exception):
    """The mounted certificate folder lacks a file; the message names it and the fix."""


def mounted_serving_files(directory: Path) -> ServingFiles:
    """The certificate and key another issuer keeps in `directory` (a Secret of type
    kubernetes.io/tls mounted there), served where they are; `ca_pem` is its ca.crt, empty
    when the Secret has none (the issuer's CA is in the caBundle either way)."""
    certfile, keyfile = directory / CERT_KEY, directory / KEY_KEY
    missing = [path.name for path in (certfile, keyfile) if not path.is_file()]
    if missing:
        raise CertificateMissing(
            f"the webhook's certificate folder {directory} has no {' or '.join(missing)}: "
            "mount the issuer's Secret there (cert-manager writes tls.crt and tls.key), or "
            "unset GPUSHARE_WEBHOOK_CERT_DIR to let the operator make its own"
        )
    ca = directory / CA_KEY
    return ServingFiles(
        certfile=certfile, keyfile=keyfile, ca_pem=ca.read_bytes() if ca.is_file() else b""
    )


async def keep_ca_bundle(
    api: KubeSchedulerApi, config: Callable[[], OperatorConfig], ca_pem: bytes
) -> None:
    """Keep every webhook of the configuration trusting `ca_pem`, for ever."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    missing_said = False
    while True:
        name = config().webhook_configuration
        interval = CHECK_INTERVAL_S
        try:
            current = await api.read_webhook_configuration(name)
            if current is None:
                if not missing_said:
                    log.warning(
                        "webhook_configuration_missing",
                        configuration=name,
                        consequence="gpu-memory pods are refused at creation until it exists: "
                        "kubectl apply -k manifests",
                    )
                    missing_said = True
                interval = MISSING_CHECK_INTERVAL_S
            else:
                missing_said = False
                webhooks = current.get("webhooks") or []
                if any(
                    (w.get("clientConfig") or {}).get("caBundle") != ca_bundle for w in webhooks
                ):
                    await api.set_ca_bundle(name, [w["name"] for w in webhooks], ca_bundle)
                    log.info("webhook_ca_bundle_set", configuration=name)
                    continue
        except (ApiError, OSError, TimeoutError) as error:
            log.warning("webhook_ca_bundle_failed", configuration=name, error=repr(error))
        await asyncio.sleep(interval)
