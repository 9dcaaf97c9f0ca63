"""The Helm chart (charts/gpushare): `helm lint`, the same objects as `kubectl kustomize
manifests/` (so the two installs never drift apart), a values file of the wrong type refused
by the chart's schema, and `helm install` on a real node through the guide's pods."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from installs import GUIDE_CARD_MIB, MANIFESTS, ROOT, Installed, installed_by

from gpushare.model import contract
from gpushare_harness.binaries import Binaries, ensure_binaries

pytestmark = [pytest.mark.integration]

CHART = ROOT / "charts" / "gpushare"
# Helm's own labels: on the chart's objects only, and not what the two installs agree on.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance")
# The dev overlay's changes, as values: fake cards and no NVIDIA runtime class.
DEV_VALUES = {
    "devicePlugin": {
        "runtimeClassName": "",
        "extraEnv": [{"name": "GPUSHARE_FAKE_GPUS", "value": "8x11178"}],
    }
}


def helm(binaries: Binaries, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Helm with its cache, config and data in `home` (never the user's)."""
    env = {
        **os.environ,
        **{f"HELM_{kind}_HOME": str(home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")},
    }
    return subprocess.run(
        [str(binaries.helm), *args], capture_output=True, text=True, check=False, env=env
    )


def objects(rendered: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    """Each object by (kind, namespace, name), without Helm's own labels."""
    found = {}
    for document in yaml.safe_load_all(rendered):
        if not isinstance(document, dict):
            continue
        meta = document["metadata"]
        for label in HELM_LABELS:
            meta.get("labels", {}).pop(label, None)
        if meta.get("labels") == {}:
            del meta["labels"]
        found[(document["kind"], meta.get("namespace", ""), meta["name"])] = document
    return found


@pytest.fixture(scope="module")
def binaries() -> Binaries:
    return ensure_binaries()


def test_helm_lint_passes(binaries: Binaries, tmp_path: Path) -> None:
    linted = helm(binaries, tmp_path, "lint", "--strict", str(CHART))
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_helm_and_kustomize_render_the_same_objects(binaries: Binaries, tmp_path: Path) -> None:
    chart = helm(binaries, tmp_path, "template", "gpushare", str(CHART), "--include-crds")
    assert chart.returncode == 0, chart.stderr
    kustomized = subprocess.run(
        [str(binaries.kubectl), "kustomize", str(MANIFESTS)],
        capture_output=True,
        text=True,
        check=True,
    )
    from_helm, from_kustomize = objects(chart.stdout), objects(kustomized.stdout)
    assert sorted(from_helm) == sorted(from_kustomize)
    for key, expected in from_kustomize.items():
        assert from_helm[key] == expected, key


def test_a_values_file_of_the_wrong_type_is_refused_naming_the_field(
    binaries: Binaries, tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    for wrong, field in (
        ({"operator": {"replicas": "two"}}, "/operator/replicas"),
        ({"policy": "worstfit"}, "/policy"),
        ({"memoryUnitMiB": "1Gi"}, "/memoryUnitMiB"),
        ({"schedulerNames": "volcano"}, "/schedulerNames"),
    ):
        values.write_text(yaml.safe_dump(wrong))
        refused = helm(binaries, tmp_path, "template", "gpushare", str(CHART), "-f", str(values))
        assert refused.returncode != 0, wrong
        assert field in refused.stderr, refused.stderr


@pytest.fixture(scope="module")
def installed(binaries: Binaries, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    directory = tmp_path_factory.mktemp("helm")
    values = directory / "dev-values.yaml"
    values.write_text(yaml.safe_dump(DEV_VALUES))

    def install(target: Installed) -> None:
        done = helm(
            binaries,
            directory,
            "install",
            "gpushare",
            str(CHART),
            "--kubeconfig",
            str(target.kubeconfig),
            "--namespace",
            "default",
            "--values",
            str(values),
        )
        assert done.returncode == 0, done.stdout + done.stderr

    yield from installed_by(directory, install)


def test_helm_install_on_a_real_node_runs_the_guides_pods(installed: Installed) -> None:
    for example in ("gpu-pod1.yaml", "gpu-pod2.yaml"):
        installed.kubectl("apply", "-f", str(MANIFESTS / "examples" / example))
    for pod in ("gpu-pod1", "gpu-pod2"):
        card = installed.running(pod)["metadata"]["annotations"][contract.GPU_INDEX]
        assert installed.gpu_env(pod) == {
            contract.ENV_VISIBLE_DEVICES: card,
            contract.ENV_GPU_ALLOCATED: "1024",
            contract.ENV_GPU_MEMORY_TOTAL: str(GUIDE_CARD_MIB),
        }
