"""The shipped manifests, read as files: least privilege and nothing left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

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


def test_the_kustomization_lists_every_manifest_but_the_examples() -> None:
    listed = set(documents(MANIFESTS / "kustomization.yaml")[0]["resources"])
    present = {
        p.relative_to(MANIFESTS).as_posix()
        for p in MANIFESTS.rglob("*.yaml")
        if p.name != "kustomization.yaml" and p.parent.name != "examples"
    }
    assert listed == present


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
