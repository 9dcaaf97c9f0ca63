"""The Helm chart read as files: its README's values table is what values.yaml and the schema
generate, every namespaced object follows the release's namespace, and the chart makes no
namespace of its own. (Rendering it with Helm, against kustomize, and installing it on a real
node: tests/integration/e2e/install/test_helm_chart.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from gpushare_harness import chartdocs

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpushare"
TEMPLATES = CHART / "templates"


def test_the_readmes_values_table_is_what_values_yaml_generates() -> None:
    readme = (CHART / "README.md").read_text()
    assert chartdocs.rendered(readme, CHART) == readme, (
        "charts/gpushare/README.md's values table is stale: run "
        "`.venv/bin/python -m gpushare_harness.chartdocs` and commit the result"
    )


def test_every_value_has_a_description_and_a_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    keys = [row.key for row in chartdocs.rows((CHART / "values.yaml").read_text(), schema)]
    for key in (
        "imagePullSecrets",
        "logLevel",
        "podMemoryLimits",
        "setSchedulerName",
        "operator.priorityClassName",
        "operator.affinity",
        "operator.podAnnotations",
        "operator.podLabels",
        "devicePlugin.namespace",
        "devicePlugin.priorityClassName",
        "devicePlugin.affinity",
        "devicePlugin.podAnnotations",
        "devicePlugin.podLabels",
        "webhook.certManager.enabled",
        "webhook.certManager.issuerRef",
        "rbac.readers",
        "metrics.serviceMonitor.labels",
    ):
        assert key in keys


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ("# documented\na: 1\nb: 2\n", "b: no comment above it"),
        ("# documented\na: 1\n# documented\nc: 3\n", "c: not in values.schema.json"),
        ("# documented\na: 1\n", "b: in values.schema.json, not in values.yaml"),
    ],
    ids=["undocumented", "unknown to the schema", "missing from the values"],
)
def test_the_generator_refuses_values_and_schema_that_disagree(values: str, problem: str) -> None:
    schema = {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    with pytest.raises(chartdocs.ChartDocsError, match=problem):
        list(chartdocs.rows(values, schema))


def test_a_description_is_the_comment_block_just_above_its_key() -> None:
    values = "# not this\n\n# the section's\ns:\n  # first line\n  # second line\n  k: 1\n"
    assert chartdocs.comments(values) == {"s": "the section's", "s.k": "first line second line"}


def test_the_chart_makes_no_namespace_and_names_none_itself() -> None:
    for path in TEMPLATES.glob("*.yaml"):
        text = path.read_text()
        assert "kind: Namespace" not in text, path.name
        assert "gpushare-system" not in text, path.name
        for line in text.splitlines():
            if re.match(r"\s*namespace:", line):
                assert 'include "gpushare.' in line or "$namespace" in line, path.name
    assert "namespaces" not in yaml.safe_load((CHART / "values.yaml").read_text())


def test_every_service_account_in_a_policy_or_binding_follows_the_release() -> None:
    for path in TEMPLATES.glob("*.yaml"):
        for account in re.findall(r"system:serviceaccount:([^:']*):", path.read_text()):
            assert account.startswith('{{ include "gpushare.'), f"{path.name}: {account}"


def test_the_notes_say_how_to_check_label_upgrade_and_uninstall() -> None:
    notes = (TEMPLATES / "NOTES.txt").read_text()
    for said in (
        "rollout status",
        "pod-security.kubernetes.io/enforce=privileged",
        "kubectl apply --server-side --force-conflicts -f <chart>/crds/",
        "helm uninstall",
        "kubectl delete crd gpunodes.gpushare.io gpushareconfigs.gpushare.io",
    ):
        assert said in notes
