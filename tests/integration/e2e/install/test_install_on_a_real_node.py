"""gpushare installed as the README tells admins to, on a real node: the images built from the
project's Dockerfiles (`gpushare-dev images`), imported into the node's containerd, the node
labelled `gpushare=true`, then `kubectl apply -k manifests/overlays/dev` with the apiserver's
Pod Security admission on. The operator Deployment (two replicas, one leads) and the device
plugin's DaemonSet pod run on the node and reach the apiserver as pods do (the `kubernetes`
Service, through kube-proxy); the guide's pods run there with their card in the env; a new
image tag rolls out while GPU pods run, and each keeps its card and env."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from installs import GUIDE_CARD_MIB, MANIFESTS, NODE, Installed, installed_by

from gpushare.model import contract

pytestmark = [pytest.mark.integration]

UPGRADE_TAG = "0.1.1"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    def apply(target: Installed) -> None:
        target.kubectl("apply", "-k", str(MANIFESTS / "overlays" / "dev"))

    yield from installed_by(tmp_path_factory.mktemp("install"), apply)


def test_the_images_stay_within_200_mb_and_carry_only_their_components_dependencies(
    installed: Installed,
) -> None:
    for image in installed.images.values():
        assert image.size_bytes <= 200 * 1000**2, f"{image.name}: {image.size_bytes} bytes"
    for component, absent in (
        ("operator", ("grpc", "grpc_tools", "pynvml", "gpushare_harness", "pytest", "pip")),
        ("device-plugin", ("kopf", "grpc_tools", "gpushare_harness", "pytest", "pip")),
    ):
        assert installed.images[component].name in installed.node.ctr("images", "ls", "-q")
        pods = installed.get(
            "pods",
            "-A",
            "-l",
            f"app.kubernetes.io/name=gpushare-{component}",
        )["items"]
        assert pods, f"no {component} pod"
        namespace, pod = pods[0]["metadata"]["namespace"], pods[0]["metadata"]["name"]
        probe = ";".join(
            f"print('{module}', importlib.util.find_spec('{module}') is not None)"
            for module in absent
        )
        found = installed.kubectl(
            "exec", "-n", namespace, pod, "--", "python3", "-c", f"import importlib.util;{probe}"
        ).stdout
        assert all(line.endswith("False") for line in found.splitlines()), found


def test_an_image_the_node_does_not_have_shows_why_its_pod_waits(
    installed: Installed, tmp_path: Path
) -> None:
    missing = "localhost/gpushare/operator:0.0.0"
    pod = tmp_path / "missing.yaml"
    pod.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: missing-image}\n"
        f"spec: {{containers: [{{name: c, image: '{missing}'}}]}}\n"
    )
    installed.kubectl("apply", "-f", str(pod))
    try:
        deadline = time.monotonic() + 60
        while True:
            statuses = installed.get("pod", "missing-image")["status"].get("containerStatuses", [])
            waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
            if waiting.get("reason") in {"ErrImagePull", "ImagePullBackOff"}:
                break
            assert time.monotonic() < deadline, statuses
            time.sleep(1)
        assert missing in waiting.get("message", ""), waiting
    finally:
        installed.kubectl("delete", "pod", "missing-image", "--ignore-not-found")


def test_the_operator_runs_two_replicas_one_leading_and_the_plugin_serves_the_node(
    installed: Installed,
) -> None:
    deployment = installed.get("-n", "gpushare-system", "deployment", "gpushare-operator")
    assert deployment["status"].get("availableReplicas") == 2
    replicas = {
        pod["metadata"]["name"]
        for pod in installed.get(
            "-n", "gpushare-system", "pods", "-l", "app.kubernetes.io/name=gpushare-operator"
        )["items"]
    }
    lease = installed.get("-n", "gpushare-system", "lease", "gpushare-scheduler")
    assert lease["spec"]["holderIdentity"] in replicas
    plugin = installed.get(
        "-n",
        "gpushare-device-plugin",
        "pods",
        "-l",
        "app.kubernetes.io/name=gpushare-device-plugin",
    )["items"]
    assert [pod["spec"]["nodeName"] for pod in plugin] == [NODE]
    deadline = time.monotonic() + 60
    while installed.get("node", NODE)["status"]["capacity"].get(contract.GPU_MEMORY) != str(
        8 * (GUIDE_CARD_MIB // contract.DEFAULT_MEMORY_UNIT_MIB)
    ):
        assert time.monotonic() < deadline, "the plugin's devices never reached the node"
        time.sleep(1)
    gpunode = installed.get("gpunodes", NODE)
    assert len(gpunode["spec"]["cards"]) == 8
    for namespace, service in (
        ("gpushare-system", "gpushare-operator-metrics"),
        ("gpushare-device-plugin", "gpushare-device-plugin-metrics"),
    ):
        slices = installed.get(
            "-n", namespace, "endpointslices", "-l", f"kubernetes.io/service-name={service}"
        )["items"]
        assert any(s.get("endpoints") for s in slices), f"{service} has no endpoints"


def test_the_guides_pods_run_with_their_card_in_the_env(installed: Installed) -> None:
    for example in ("gpu-pod1.yaml", "gpu-pod2.yaml"):
        installed.kubectl("apply", "-f", str(MANIFESTS / "examples" / example))
    try:
        for pod in ("gpu-pod1", "gpu-pod2"):
            found = installed.running(pod)
            card = found["metadata"]["annotations"][contract.GPU_INDEX]
            assert installed.gpu_env(pod) == {
                contract.ENV_VISIBLE_DEVICES: card,
                contract.ENV_GPU_ALLOCATED: "1024",
                contract.ENV_GPU_MEMORY_TOTAL: str(GUIDE_CARD_MIB),
            }
    finally:
        installed.kubectl("delete", "pod", "gpu-pod1", "gpu-pod2", "--ignore-not-found")


def test_a_new_image_tag_rolls_out_and_every_running_pod_keeps_its_card_and_env(
    installed: Installed, tmp_path: Path
) -> None:
    guide = (MANIFESTS / "examples" / "gpu-pod1.yaml").read_text()
    before: dict[str, dict[str, str]] = {}
    for name in ("upgrade-a", "upgrade-b"):
        manifest = tmp_path / f"{name}.yaml"
        manifest.write_text(guide.replace("name: gpu-pod1", f"name: {name}"))
        installed.kubectl("apply", "-f", str(manifest))
        installed.running(name)
        before[name] = installed.gpu_env(name)
    for image in installed.images.values():
        repository = image.name.rsplit(":", 1)[0]
        installed.node.ctr("images", "tag", "--force", image.name, f"{repository}:{UPGRADE_TAG}")
    overlay = tmp_path / "upgrade"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources: [{os.path.relpath(MANIFESTS / 'overlays' / 'dev', overlay)}]\n"
        "images:\n"
        f"  - {{name: localhost/gpushare/operator, newTag: '{UPGRADE_TAG}'}}\n"
        f"  - {{name: localhost/gpushare/device-plugin, newTag: '{UPGRADE_TAG}'}}\n"
    )
    try:
        installed.kubectl("apply", "-k", str(overlay))
        installed.rolled_out()
        for namespace, name in (
            ("gpushare-system", "gpushare-operator"),
            ("gpushare-device-plugin", "gpushare-device-plugin"),
        ):
            pods = installed.get("-n", namespace, "pods", "-l", f"app.kubernetes.io/name={name}")[
                "items"
            ]
            images = {
                pod["spec"]["containers"][0]["image"]
                for pod in pods
                if not pod["metadata"].get("deletionTimestamp")  # the old ones, going
            }
            assert images == {f"localhost/gpushare/{name.removeprefix('gpushare-')}:{UPGRADE_TAG}"}
        for name, env in before.items():
            assert installed.running(name)["status"]["phase"] == "Running"
            assert installed.gpu_env(name) == env
        after = tmp_path / "upgrade-c.yaml"
        after.write_text(guide.replace("name: gpu-pod1", "name: upgrade-c"))
        installed.kubectl("apply", "-f", str(after))
        placed = installed.running("upgrade-c")
        card = placed["metadata"]["annotations"][contract.GPU_INDEX]
        assert installed.gpu_env("upgrade-c") == {
            contract.ENV_VISIBLE_DEVICES: card,
            contract.ENV_GPU_ALLOCATED: "1024",
            contract.ENV_GPU_MEMORY_TOTAL: str(GUIDE_CARD_MIB),
        }
        deadline = time.monotonic() + 30  # the leader writes GPUNode status every 2 s
        while installed.get("gpunodes", NODE)["status"]["allocatedMiB"] != 3 * 1024:
            assert time.monotonic() < deadline, installed.get("gpunodes", NODE)["status"]
            time.sleep(1)
    finally:
        installed.kubectl(
            "delete", "pod", "upgrade-a", "upgrade-b", "upgrade-c", "--ignore-not-found"
        )


def test_a_pod_that_bypasses_the_scheduler_is_refused_and_the_placed_pod_keeps_its_card(
    installed: Installed, tmp_path: Path
) -> None:
    guide = (MANIFESTS / "examples" / "gpu-pod1.yaml").read_text()
    bypass = tmp_path / "bypass.yaml"
    bypass.write_text(
        guide.replace("name: gpu-pod1", "name: bypass").replace(
            "schedulerName: volcano", f"nodeName: {NODE}"
        )
    )
    placed = tmp_path / "placed.yaml"
    placed.write_text(guide.replace("name: gpu-pod1", "name: placed"))
    try:
        # Just before a placed pod of the same size: this once took the placed pod's card.
        refused = installed.kubectl("apply", "-f", str(bypass), check=False)
        installed.kubectl("apply", "-f", str(placed))
        assert refused.returncode != 0
        assert "spec.nodeName" in refused.stderr
        assert f"kubernetes.io/hostname: {NODE}" in refused.stderr
        pod = installed.running("placed")
        card = pod["metadata"]["annotations"][contract.GPU_INDEX]
        assert installed.gpu_env("placed")[contract.ENV_VISIBLE_DEVICES] == card
        assert installed.kubectl("get", "pod", "bypass", check=False).returncode != 0
    finally:
        installed.kubectl("delete", "pod", "placed", "--ignore-not-found")
