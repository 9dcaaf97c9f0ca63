"""The shipped manifests, read as files: least privilege and nothing left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpushare.model import contract
from gpushare_operator.config import OperatorConfig, lease_label, live_spec_schema

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


AGGREGATES = {
    f"rbac.authorization.k8s.io/aggregate-to-{role}": "true" for role in ("view", "edit", "admin")
}
USERS = MANIFESTS / "base" / "rbac" / "users.yaml"


def test_every_crd_is_readable_through_the_aggregated_view_role() -> None:
    shipped = {
        documents(path)[0]["spec"]["names"]["plural"]
        for path in (MANIFESTS / "base" / "crds").glob("*.yaml")
    }
    (view,) = [
        d
        for d in documents(USERS)
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpushare-view"
    ]
    assert AGGREGATES.items() <= view["metadata"]["labels"].items()
    assert view["rules"] == [
        {
            "apiGroups": ["gpushare.io"],
            "resources": sorted(shipped),
            "verbs": ["get", "list", "watch"],
        }
    ]


def test_every_authenticated_user_may_read_and_nothing_more() -> None:
    """GPUNodes are cluster-scoped: `view` bound in one namespace reaches none, so the read
    role is bound to every authenticated user, and it and the Lease's role only read."""
    everyone = {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Group",
        "name": "system:authenticated",
    }
    roles = {d["metadata"]["name"]: d for d in documents(USERS) if d["kind"].endswith("Role")}
    bindings = [d for d in documents(USERS) if d["kind"].endswith("Binding")]
    assert {(b["kind"], b["roleRef"]["name"]) for b in bindings} == {
        ("ClusterRoleBinding", "gpushare-view"),
        ("RoleBinding", "gpushare-lease-view"),
    }
    for binding in bindings:
        assert binding["subjects"] == [everyone]
        for rule in roles[binding["roleRef"]["name"]]["rules"]:
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
    (lease,) = roles["gpushare-lease-view"]["rules"]
    assert lease["resourceNames"] == ["gpushare-scheduler"]
    assert roles["gpushare-lease-view"]["metadata"]["namespace"] == "gpushare-system"


def test_writing_the_live_configuration_is_a_role_no_one_gets_by_default() -> None:
    (editor,) = [d for d in documents(USERS) if d["metadata"]["name"] == "gpushare-config-editor"]
    assert not AGGREGATES.keys() & editor["metadata"].get("labels", {}).keys()
    assert [rule["resources"] for rule in editor["rules"]] == [["gpushareconfigs"]]
    bound = {
        doc["roleRef"]["name"]
        for path in MANIFESTS.rglob("*.yaml")
        for doc in documents(path)
        if doc.get("kind", "").endswith("Binding") and "roleRef" in doc
    }
    assert "gpushare-config-editor" not in bound


def test_the_device_plugins_namespace_is_exempt_from_the_gpu_env_policy_by_name() -> None:
    (binding,) = [
        d
        for d in documents(MANIFESTS / "base" / "admission" / "gpu-env.yaml")
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
    ]
    expressions = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert {
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": ["gpushare-device-plugin"],
    } in expressions


def test_the_leader_writes_fence_selects_the_operators_lease_in_the_shape_the_operator_sets() -> (
    None
):
    policy, binding = (
        doc
        for doc in documents(MANIFESTS / "base" / "rbac" / "operator.yaml")
        if doc["metadata"]["name"] == contract.FENCE_BINDING
    )
    config = OperatorConfig()
    validation = policy["spec"]["validations"][0]
    assert contract.TERM_OVER in validation["messageExpression"]
    assert contract.TERM_OVER in validation["message"]  # if the expression cannot be built
    assert f"'{contract.LEADER_TERM}'" in validation["messageExpression"]
    # The operator's JSON Patch tests the first requirement and replaces the second's values.
    assert binding["spec"]["matchResources"]["objectSelector"]["matchExpressions"] == [
        {
            "key": contract.LEASE_LABEL,
            "operator": "In",
            "values": [lease_label(config.lease_namespace, config.lease_name)],
        },
        {"key": contract.LEASE_TERM_LABEL, "operator": "NotIn", "values": ["none"]},
    ]
