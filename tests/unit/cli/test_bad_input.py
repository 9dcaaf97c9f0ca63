"""What `gpushare` says of input it cannot use, in one line and before any call to the
cluster: a Pod manifest the apiserver would refuse (`simulate -f`), a bad value in a
GPUSHARE_* variable it decides with. Variables it does not use are no concern of it."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest
from builders import ready_node
from cli_runs import gpushare
from scripted import Apiserver, listing

from gpushare_cli.kubeconfig import Source

WEBHOOK = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpushare"


@pytest.fixture(autouse=True)
def admin(apiserver: Apiserver) -> None:
    """A cluster admin's view of one idle GPU node, the admission webhook installed."""
    apiserver["/api/v1/nodes"] = listing(ready_node("gpu-1", 22356, 2))
    apiserver["/api/v1/pods"] = listing()
    apiserver["/apis/policy/v1/poddisruptionbudgets"] = listing()
    apiserver["/apis/coordination.k8s.io/v1/leases"] = listing()
    apiserver[WEBHOOK] = (200, {"webhooks": []})


GPU_CONTAINER = "{name: c, resources: {limits: {volcano.sh/gpu-memory: '1024'}}}"


class Malformed(NamedTuple):
    """A Pod manifest's metadata and spec (flow YAML), and the field the apiserver refuses."""

    metadata: str
    spec: str
    refused: str


@pytest.mark.parametrize(
    "pod",
    [
        Malformed(
            "{name: p, annotations: 1}",
            f"containers: [{GPU_CONTAINER}]",
            "metadata.annotations must map names to strings",
        ),
        Malformed(
            "{name: p, labels: {app: 1}}",
            f"containers: [{GPU_CONTAINER}]",
            "metadata.labels must map names to strings",
        ),
        Malformed("{name: p}", "containers: [null]", "spec.containers[0] must be a mapping"),
        Malformed(
            "{name: p}",
            f"initContainers: 1, containers: [{GPU_CONTAINER}]",
            "spec.initContainers must be a list",
        ),
        Malformed(
            "{name: p}",
            "containers: [{name: c, resources: {limits: 1}}]",
            "spec.containers[0].resources.limits must be a mapping",
        ),
    ],
)
def test_simulate_refuses_a_pod_the_apiserver_would_refuse_naming_the_field(
    apiserver: Apiserver,
    source: Source,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    pod: Malformed,
) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata: {pod.metadata}\n"
        f"spec: {{schedulerName: volcano, {pod.spec}}}\n"
    )
    status, out, err = gpushare(capsys, source, "simulate", "-f", str(manifest))
    assert (status, out) == (2, "")
    assert err == f"gpushare: {manifest}: {pod.refused} (the apiserver would refuse this Pod)\n"
    assert apiserver.asked == []


def test_a_pod_manifest_that_is_not_yaml_is_said_in_one_line(
    source: Source, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pod = tmp_path / "pod.yaml"
    pod.write_text("kind: Pod\nspec: [unclosed\n")
    status, _, err = gpushare(capsys, source, "simulate", "-f", str(pod))
    assert status == 2
    assert err == (
        f"gpushare: {pod} is not valid YAML (expected ',' or ']', but got '<stream end>' at "
        "line 3, column 1)\n"
    )


@pytest.mark.parametrize(
    "variable",
    [
        ("GPUSHARE_METRICS_PORT", "metrics"),  # copied from the operator's Deployment
        ("GPUSHARE_WEBHOOK_PORT", "tcp://10.96.0.12:443"),  # a Service link, in a pod
    ],
)
def test_a_gpushare_variable_the_cli_does_not_decide_with_is_no_concern_of_it(
    source: Source,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variable: tuple[str, str],
) -> None:
    monkeypatch.setenv(*variable)
    status, out, err = gpushare(capsys, source, "inspect")
    assert (status, err) == (0, "")
    assert out.splitlines()[1].startswith("gpu-1")


def test_a_bad_gpushare_variable_the_cli_decides_with_is_one_line_naming_it(
    apiserver: Apiserver,
    source: Source,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUSHARE_POLICY", "worstfit")
    status, out, err = gpushare(capsys, source, "inspect")
    assert (status, out) == (2, "")
    assert err == (
        "gpushare: this shell's GPUSHARE_* variables, which gpushare decides with when no "
        "operator leads, are refused (invalid configuration: GPUSHARE_POLICY='worstfit': must "
        "be bestfit, firstfit, binpack or spread); correct or unset the variable named\n"
    )
    assert apiserver.asked == []
