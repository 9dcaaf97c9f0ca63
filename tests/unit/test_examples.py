"""The example pods: those beside the guide's run on a current stack and are admitted."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from gpushare.model.admission import admit
from gpushare_operator.config import OperatorConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
GUIDES = {"gpu-pod1.yaml", "gpu-pod2.yaml"}


def current_pods() -> list[dict[str, Any]]:
    return [
        pod
        for path in sorted(EXAMPLES.glob("*.yaml"))
        if path.name not in GUIDES
        for pod in yaml.safe_load_all(path.read_text())
        if isinstance(pod, dict) and pod.get("kind") == "Pod"
    ]


def test_the_examples_beside_the_guides_use_a_cuda_image_nvidia_still_publishes() -> None:
    pods = current_pods()
    assert pods
    for pod in pods:
        for container in pod["spec"]["containers"]:
            found = re.fullmatch(
                r"nvidia/cuda:(\d+)\.\d+\.\d+-base-ubuntu\d+\.\d+", container["image"]
            )
            assert found, container["image"]
            assert int(found[1]) >= 12, container["image"]
        # The NVIDIA runtime reads the envvar strategy's variable: named, not assumed default.
        assert pod["spec"]["runtimeClassName"] == "nvidia"


def test_the_examples_beside_the_guides_are_admitted_as_written() -> None:
    settings = OperatorConfig().admission()
    for pod in current_pods():
        admit(pod, settings).apply(pod)  # raises GpuShareError naming the problem
        assert pod["spec"]["schedulerName"] == "volcano"
