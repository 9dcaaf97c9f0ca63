"""kopf adapters only: the operator's life cycle, its liveness probe, its live
configuration (GPUShareConfig, watched with `@kopf.on.event`, so kopf writes nothing to it)
and the admission webhook for GPU pods (`@kopf.on.mutate`, served by every replica; its
configuration is the project's manifest, not kopf's, so that `matchConditions` keep every
other pod off it).

Pods, nodes and GPUNodes are not watched through kopf: the Runtime's own reflectors list
them in pages and watch them (gpushare.kube.reflector), and keep slim copies. kopf's watch
lists a kind in one unpaged response and keeps state per object, which at 50,000 pods cost
more memory than the whole scheduler cache. Nothing is written to users' pods or nodes but the
scheduler's own Binding, condition and Events.

Run it with `kopf run --standalone -A -m gpushare_operator.handlers` or `gpushare-operator`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf

from gpushare import kube, logs
from gpushare.model import GpuShareError, contract
from gpushare.model.admission import NOTHING, admit
from gpushare.model.bodies import mapping
from gpushare_operator.config import OperatorConfig, load
from gpushare_operator.kubeapi import COMPONENT, KubeSchedulerApi
from gpushare_operator.runtime import Runtime
from gpushare_operator.webhook import (
    CertificateMissing,
    keep_ca_bundle,
    mounted_serving_files,
    shared_certificate,
    write_serving_files,
)

_RUNTIME = "gpushare"
_CONFIG = "gpushare_config"
_SYNC_TIMEOUT_S = 300.0
_CONNECTIONS = 64
"""The ApiClient's HTTP/1.1 connections: the reflectors' watches (about 7, each holding one)
and calls a few at a time (the Lease, the reporter's 4 workers for refusals, status writes,
evictions), but for the reads that follow failed Bindings, which wait their turn."""


def kopf_memo(config: OperatorConfig) -> kopf.Memo:
    """kopf's memo for a run with `config` (what `gpushare-operator` read from its flags and
    environment): the startup handler takes it from there."""
    return kopf.Memo({_CONFIG: config})


def runtime(memo: Any) -> Runtime:
    found = memo.get(_RUNTIME)
    assert isinstance(found, Runtime), "the startup handler did not run"
    return found


@kopf.on.startup()
async def startup(*, settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # `kopf run -m gpushare_operator.handlers` passes no memo: the environment alone then.
    config = memo.get(_CONFIG) or load({}, os.environ)
    logs.configure(config.log_level)
    # Log lines must never become Events on users' pods, and cluster-wide watches need no
    # namespace scanning (so the RBAC role needs no namespace list).
    settings.posting.enabled = False
    settings.posting.level = logging.WARNING
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    # HTTP/1.1, a connection per call in flight: the watches, reads, reports, status writes
    # and evictions. Bindings and Events go over an HTTP/2 connection of their own (kubeapi).
    api_client = await kube.api_client(connections=_CONNECTIONS, user_agent=COMPONENT)
    api = KubeSchedulerApi(api_client, identity=config.identity, timeout_s=config.bind_timeout_s)
    state = Runtime(config=config, api=api, on_failure=_stop_operator)
    api.time_out_by(lambda: state.config.bind_timeout_s)
    api.fence_leader_writes(state.fence.check, state.fence.stamp, state.elector.on_term_refused)
    state.metrics.serve(config.metrics_port)
    memo[_RUNTIME] = state
    memo["gpushare_api_client"] = api_client
    memo["gpushare_api"] = api
    settings.admission.managed = None
    if config.webhook_port:
        if config.webhook_cert_dir:  # another issuer's (cert-manager): it keeps the caBundle
            try:
                files = mounted_serving_files(Path(config.webhook_cert_dir))
            except CertificateMissing as error:
                raise kopf.PermanentError(str(error)) from None
            logs.get("webhook").info(
                "webhook_certificate_mounted",
                directory=config.webhook_cert_dir,
                ca_bundle="kept by the certificate's issuer, not by the operator",
            )
        else:
            files = write_serving_files(await shared_certificate(api, config))
            state.spawn(keep_ca_bundle(api, state.current_config, files.ca_pem), "webhook caBundle")
        settings.admission.server = kopf.WebhookServer(
            addr=config.webhook_address,
            port=config.webhook_port,
            certfile=str(files.certfile),
            pkeyfile=str(files.keyfile),
        )
    else:
        settings.admission.server = NoWebhook()
    state.start()


def _stop_operator() -> None:
    """A task of the Runtime failed: stop as SIGTERM stops kopf (the cleanup handler releases
    the Lease, so the standby takes over at once)."""
    signal.raise_signal(signal.SIGTERM)


class NoWebhook:
    """The webhook server when `--webhook-port=0`: serves nothing, and says so."""

    async def __call__(self, fn: object) -> AsyncIterator[kopf.WebhookClientConfig]:
        logs.get("webhook").warning(
            "webhook_disabled", consequence="GPU pods are refused at creation"
        )
        await asyncio.Event().wait()
        yield kopf.WebhookClientConfig()  # never reached: the wait above never ends


@kopf.on.mutate("pods", id="gpu-pods", operation="CREATE")
async def gpu_pod_admission(*, body: kopf.Body, patch: kopf.Patch, memo: Any, **_: Any) -> None:
    """Converts a GPU pod's gpu-memory limits to the cluster's unit and labels it a GPU pod,
    or refuses a pod that could never run, with the fix (the apiserver shows the message to
    whoever created it)."""
    try:
        admitted = admit(dict(body), runtime(memo).config.admission())
    except GpuShareError as error:
        raise kopf.AdmissionError(str(error), code=422) from None
    if admitted != NOTHING:
        patch.fns.append(admitted.apply)  # type: ignore[arg-type]  # RawBody is a dict


@kopf.on.cleanup()
async def cleanup(*, memo: Any, **_: Any) -> None:
    state = memo.get(_RUNTIME)
    if isinstance(state, Runtime):
        await state.stop()
    api = memo.get("gpushare_api")
    if isinstance(api, KubeSchedulerApi):
        await api.close()
    api_client = memo.get("gpushare_api_client")
    if api_client is not None:
        await api_client.close()


@kopf.on.event(contract.CONFIG_GROUP, contract.CONFIG_VERSION, contract.CONFIG_PLURAL)
async def config_event(*, type: str, body: kopf.Body, memo: Any, **_: Any) -> None:
    state = runtime(memo)
    name = str(body.metadata.name)
    status = mapping(body.get("status"))
    in_force = status.get("inForce")
    verdict = await state.apply_config(
        type, name, mapping(body.get("spec")), in_force if isinstance(in_force, dict) else None
    )
    said = (status.get("message"), status.get("inForce"))
    if type != "DELETED" and said != (verdict.message, verdict.in_force):
        try:
            await state.api.report_config(
                name, accepted=verdict.accepted, message=verdict.message, in_force=verdict.in_force
            )
        except kube.ApiError as error:
            logs.get("operator").warning("config_status_failed", error=str(error))


@kopf.on.probe(id="gpushare")
async def freshness(*, memo: Any, **_: Any) -> dict[str, Any]:
    """Liveness that means something: the cache was loaded, and the API answered recently.

    Fails (so the probe restarts the replica) when the initial sync has not completed after
    5 minutes, when the Lease calls have had no answer for 3 lease durations, or when one of
    its tasks failed (it is stopping)."""
    state = runtime(memo)
    now = time.monotonic()
    if state.failure is not None:
        raise kopf.PermanentError(f"a task failed: {state.failure}")
    if not state.synced.is_set() and now - state.started_at > _SYNC_TIMEOUT_S:
        raise kopf.PermanentError("the watches have not listed the cluster after 5 minutes")
    contact = state.elector.last_contact
    if (
        state.config.leader_elect
        and contact is not None
        and (time.time() - contact > 3 * state.config.lease_duration_s)
    ):
        raise kopf.PermanentError("the Kubernetes API has not answered the Lease calls")
    return {
        "synced": state.synced.is_set(),
        "leading": state.leading,
        "seconds_since_event": {k: round(now - v, 1) for k, v in state.intake.last_event.items()},
        "queue": dataclasses.asdict(state.queue.depth()),
    }
