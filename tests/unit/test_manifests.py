"""The shipped manifests, read as files: least privilege and nothing left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpushare_operator.config import live_spec_schema

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def test_no_role_grants_a_wildcard() -> None:
    rules = [
        rule
        for path in MANIFESTS.rglob("*.yaml")
        for doc in documents(path)
        if doc.get("kind") in {"ClusterRole", "Role"}
        for rule in doc.get("rules", [])
    ]
    assert rules
    for rule in rules:
        for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert "*" not in rule.get(field, []), rule
            assert not any("*" in value for value in rule.get(field, [])), rule


def test_each_component_has_its_own_service_account() -> None:
    workloads = {
        doc["metadata"]["name"]: doc["spec"]["template"]["spec"]["serviceAccountName"]
        for path in MANIFESTS.rglob("*.yaml")
        for doc in documents(path)
        if doc.get("kind") in {"Deployment", "DaemonSet"}
    }
    assert workloads == {
        "gpushare-operator": "gpushare-operator",
        "gpushare-device-plugin": "gpushare-device-plugin",
    }


def test_the_base_kustomization_lists_every_manifest_of_the_base() -> None:
    base = MANIFESTS / "base"
    listed = set(documents(base / "kustomization.yaml")[0]["resources"])
    present = {
        p.relative_to(base).as_posix()
        for p in base.rglob("*.yaml")
        if p.name != "kustomization.yaml"
    }
    assert listed == present
    assert documents(MANIFESTS / "kustomization.yaml")[0]["resources"] == ["base"]


def test_fake_cards_and_the_dropped_runtime_class_live_in_the_dev_overlay_only() -> None:
    shipped = list((MANIFESTS / "base").rglob("*.yaml"))
    assert not any("GPUSHARE_FAKE_GPUS" in p.read_text() for p in shipped)
    dev = (MANIFESTS / "overlays" / "dev" / "kustomization.yaml").read_text()
    assert "GPUSHARE_FAKE_GPUS" in dev
    assert "../../base" in dev


def test_only_the_device_plugins_namespace_is_privileged() -> None:
    levels = {
        doc["metadata"]["name"]: doc["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
        for doc in documents(MANIFESTS / "base" / "namespace.yaml")
    }
    assert levels == {"gpushare-system": "restricted", "gpushare-device-plugin": "privileged"}
    for path in (MANIFESTS / "base").rglob("*.yaml"):
        for doc in documents(path):
            volumes = doc.get("spec", {}).get("template", {}).get("spec", {}).get("volumes", [])
            if any("hostPath" in volume for volume in volumes):
                assert doc["metadata"]["namespace"] == "gpushare-device-plugin", path


def test_containers_run_without_privilege() -> None:
    for path in MANIFESTS.rglob("*.yaml"):
        for doc in documents(path):
            if doc.get("kind") not in {"Deployment", "DaemonSet"}:
                continue
            for container in doc["spec"]["template"]["spec"]["containers"]:
                context = container["securityContext"]
                assert context["allowPrivilegeEscalation"] is False
                assert context["readOnlyRootFilesystem"] is True
                assert context["capabilities"]["drop"] == ["ALL"]
                assert not context.get("privileged")
                assert container["resources"]["requests"]


CHART_CRDS = MANIFESTS.parent / "charts" / "gpushare" / "crds"


def test_the_chart_installs_the_same_crds_as_the_manifests() -> None:
    for path in sorted((MANIFESTS / "base" / "crds").glob("*.yaml")):
        assert (CHART_CRDS / path.name).read_text() == path.read_text(), path.name


def test_the_gpushareconfig_schema_is_the_operators_option_table() -> None:
    (crd,) = documents(MANIFESTS / "base" / "crds" / "gpushareconfigs.gpushare.io.yaml")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    expected = yaml.safe_dump(live_spec_schema(), sort_keys=False, width=95)
    assert schema["properties"]["spec"] == live_spec_schema(), (
        "put this under openAPIV3Schema.properties.spec of both GPUShareConfig CRDs:\n" + expected
    )


def test_every_crd_is_in_the_gpushare_category() -> None:
    for path in sorted((MANIFESTS / "base" / "crds").glob("*.yaml")):
        (crd,) = documents(path)
        assert "gpushare" in crd["spec"]["names"].get("categories", []), path.name
