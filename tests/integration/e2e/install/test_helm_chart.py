"""The Helm chart (charts/gpushare): `helm lint`, the same objects as `kubectl kustomize
manifests/` (so the two installs never drift apart), every object in the release's namespace,
the values reaching the objects they name, a values file of the wrong type refused by the
chart's schema; then on a real node: `helm install -n gpushare-system --create-namespace`
through the guide's pods, `helm upgrade` with a CRD change (applied as the chart's README
says) while a GPU pod runs, and `helm uninstall` removing what the README says and leaving
the rest."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from installs import GUIDE_CARD_MIB, MANIFESTS, NODE, ROOT, Installed, installed_by

from gpushare.model import contract
from gpushare_harness.binaries import Binaries, ensure_binaries

pytestmark = [pytest.mark.integration]

CHART = ROOT / "charts" / "gpushare"
RELEASE_NAMESPACE = "gpushare-system"
# Helm's own labels: on the chart's objects only, and not what the two installs agree on.
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance")
# The dev overlay's changes, as values: fake cards and no NVIDIA runtime class.
DEV_VALUES = {
    "devicePlugin": {
        "runtimeClassName": "",
        "extraEnv": [{"name": "GPUSHARE_FAKE_GPUS", "value": "8x11178"}],
    }
}
# The kustomize install's layout, as values: the plugin in a privileged namespace of its own.
KUSTOMIZE_LAYOUT = (
    *("--namespace", "gpushare-system"),
    *("--set", "devicePlugin.namespace=gpushare-device-plugin"),
)


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


def template(binaries: Binaries, home: Path, *args: str) -> dict[tuple[str, str, str], Any]:
    rendered = helm(binaries, home, "template", "gpushare", str(CHART), *args)
    assert rendered.returncode == 0, rendered.stderr
    return objects(rendered.stdout)


def values_file(directory: Path, values: dict[str, Any]) -> str:
    path = directory / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def env_of(workload: dict[str, Any]) -> dict[str, str]:
    container = workload["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item.get("value", "") for item in container["env"]}


@pytest.fixture(scope="module")
def binaries() -> Binaries:
    return ensure_binaries()


def test_helm_lint_passes(binaries: Binaries, tmp_path: Path) -> None:
    for extra in ((), ("--set", "webhook.certManager.enabled=true", "--set", "rbac.readers=null")):
        linted = helm(binaries, tmp_path, "lint", "--strict", str(CHART), *extra)
        assert linted.returncode == 0, linted.stdout + linted.stderr


def test_helm_and_kustomize_render_the_same_objects(binaries: Binaries, tmp_path: Path) -> None:
    """The chart with the plugin's namespace set renders what kustomize does, less the
    namespaces (kustomize makes them; Helm installs into existing ones)."""
    from_helm = template(binaries, tmp_path, "--include-crds", *KUSTOMIZE_LAYOUT)
    kustomized = subprocess.run(
        [str(binaries.kubectl), "kustomize", str(MANIFESTS)],
        capture_output=True,
        text=True,
        check=True,
    )
    from_kustomize = objects(kustomized.stdout)
    assert {key[2] for key in from_kustomize if key[0] == "Namespace"} == {
        "gpushare-system",
        "gpushare-device-plugin",
    }
    from_kustomize = {key: v for key, v in from_kustomize.items() if key[0] != "Namespace"}
    assert sorted(from_helm) == sorted(from_kustomize)
    for key, expected in from_kustomize.items():
        assert from_helm[key] == expected, key


def test_everything_goes_to_the_release_namespace_and_names_it(
    binaries: Binaries, tmp_path: Path
) -> None:
    rendered = helm(binaries, tmp_path, "template", "gpushare", str(CHART), "-n", "team-gpu")
    assert rendered.returncode == 0, rendered.stderr
    assert "gpushare-system" not in rendered.stdout
    assert "serviceaccount:gpushare-device-plugin:" not in rendered.stdout
    found = objects(rendered.stdout)
    assert not [key for key in found if key[0] == "Namespace"]
    namespaced = {key[1] for key in found if key[1]}
    assert namespaced == {"team-gpu"}
    webhook = found[("MutatingWebhookConfiguration", "", "gpushare")]
    assert webhook["webhooks"][0]["clientConfig"]["service"]["namespace"] == "team-gpu"
    policy = found[("ValidatingAdmissionPolicy", "", "gpushare-gpu-pods")]
    messages = [validation.get("message", "") for validation in policy["spec"]["validations"]]
    naming = [message for message in messages if "kubectl -n" in message]
    assert len(naming) == 2  # the pod not converted, the pod not labelled
    assert all("kubectl -n team-gpu get pods,endpoints gpushare-webhook" in m for m in naming)
    for name in ("gpushare-pod-placement", "gpushare-operator-scope"):
        text = yaml.safe_dump(found[("ValidatingAdmissionPolicy", "", name)])
        assert "system:serviceaccount:team-gpu:gpushare-" in text
    binding = found[("ValidatingAdmissionPolicyBinding", "", "gpushare-gpu-env")]
    selector = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    exempt = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["team-gpu"]}
    assert exempt in selector
    subjects = [
        subject
        for key, body in found.items()
        if key[0] in {"ClusterRoleBinding", "RoleBinding"}
        for subject in body["subjects"]
        if subject["kind"] == "ServiceAccount"
    ]
    assert subjects
    assert {subject["namespace"] for subject in subjects} == {"team-gpu"}
    flow = found[("FlowSchema", "", "gpushare-operator")]
    assert flow["spec"]["rules"][0]["subjects"][0]["serviceAccount"]["namespace"] == "team-gpu"


def test_the_values_reach_the_objects_they_name(binaries: Binaries, tmp_path: Path) -> None:
    values = {
        "imagePullSecrets": [{"name": "regcred"}],
        "logLevel": "debug",
        "setSchedulerName": True,
        "podMemoryLimits": "Units",
        "operator": {
            "priorityClassName": "",
            "podAnnotations": {"example.com/a": "1"},
            "podLabels": {"team": "gpu"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}},
        },
        "devicePlugin": {
            "priorityClassName": "gpu-node-critical",
            "podAnnotations": {"example.com/b": "2"},
            "podLabels": {"tier": "node"},
            "affinity": {"podAffinity": {}},
        },
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}},
        "rbac": {"readers": []},
    }
    found = template(binaries, tmp_path, "-n", "gpu", "-f", values_file(tmp_path, values))
    operator = found[("Deployment", "gpu", "gpushare-operator")]
    plugin = found[("DaemonSet", "gpu", "gpushare-device-plugin")]
    for workload, annotation, label in (
        (operator, {"example.com/a": "1"}, {"team": "gpu"}),
        (plugin, {"example.com/b": "2"}, {"tier": "node"}),
    ):
        pod = workload["spec"]["template"]
        assert pod["metadata"]["annotations"] == annotation
        assert label.items() <= pod["metadata"]["labels"].items()
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
        assert env_of(workload)["GPUSHARE_LOG_LEVEL"] == "debug"
        assert workload["spec"]["selector"]["matchLabels"].keys() == {"app.kubernetes.io/name"}
    assert "priorityClassName" not in operator["spec"]["template"]["spec"]
    assert plugin["spec"]["template"]["spec"]["priorityClassName"] == "gpu-node-critical"
    # Given keys merge into the default anti-affinity (the README says how to drop it).
    assert operator["spec"]["template"]["spec"]["affinity"].keys() == {
        "podAntiAffinity",
        "nodeAffinity",
    }
    assert plugin["spec"]["template"]["spec"]["affinity"] == {"podAffinity": {}}
    assert env_of(operator)["GPUSHARE_SET_SCHEDULER_NAME"] == "true"
    assert env_of(operator)["GPUSHARE_POD_MEMORY_LIMITS"] == "Units"
    for name in ("gpushare-operator", "gpushare-device-plugin"):
        monitor = found[("ServiceMonitor", "gpu", name)]
        assert monitor["metadata"]["labels"]["release"] == "kps"
    assert ("ClusterRole", "", "gpushare-view") in found
    bound = {key[2] for key in found if key[0] in {"ClusterRoleBinding", "RoleBinding"}}
    assert not bound & {"gpushare-view", "gpushare-lease-view"}  # rbac.readers: []


def test_with_cert_manager_the_operator_serves_the_mounted_certificate(
    binaries: Binaries, tmp_path: Path
) -> None:
    found = template(binaries, tmp_path, "-n", "gpu", "--set", "webhook.certManager.enabled=true")
    certificate = found[("Certificate", "gpu", "gpushare-webhook")]
    assert certificate["spec"]["dnsNames"] == [
        "gpushare-webhook.gpu.svc",
        "gpushare-webhook.gpu.svc.cluster.local",
    ]
    assert certificate["spec"]["issuerRef"]["name"] == "gpushare-webhook-ca"
    assert found[("Certificate", "gpu", "gpushare-webhook-ca")]["spec"]["isCA"] is True
    assert ("Issuer", "gpu", "gpushare-selfsigned") in found
    webhook = found[("MutatingWebhookConfiguration", "", "gpushare")]
    assert webhook["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": "gpu/gpushare-webhook"
    }
    operator = found[("Deployment", "gpu", "gpushare-operator")]
    mounted = env_of(operator)["GPUSHARE_WEBHOOK_CERT_DIR"]
    pod = operator["spec"]["template"]["spec"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == mounted]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == certificate["spec"]["secretName"]
    # The rights the operator's own certificate needs are gone.
    roles = (
        ("ClusterRole", "", "gpushare-operator"),
        ("Role", "gpu", "gpushare-operator-leader-election"),
    )
    rules = [rule for key in roles for rule in found[key]["rules"]]
    resources = {resource for rule in rules for resource in rule["resources"]}
    assert not resources & {"secrets", "mutatingwebhookconfigurations"}

    issuer = {"name": "corporate-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    values = {"webhook": {"certManager": {"enabled": True, "issuerRef": issuer}}}
    found = template(binaries, tmp_path, "-n", "gpu", "-f", values_file(tmp_path, values))
    assert found[("Certificate", "gpu", "gpushare-webhook")]["spec"]["issuerRef"] == issuer
    assert not [key for key in found if key[0] == "Issuer"]


def test_a_values_file_of_the_wrong_type_is_refused_naming_the_field(
    binaries: Binaries, tmp_path: Path
) -> None:
    values = tmp_path / "values.yaml"
    for wrong, field in (
        ({"operator": {"replicas": "two"}}, "/operator/replicas"),
        ({"policy": "worstfit"}, "/policy"),
        ({"memoryUnitMiB": "1Gi"}, "/memoryUnitMiB"),
        ({"schedulerNames": "volcano"}, "/schedulerNames"),
        ({"logLevel": "verbose"}, "/logLevel"),
        ({"podMemoryLimits": "GiB"}, "/podMemoryLimits"),
        ({"imagePullSecrets": ["regcred"]}, "/imagePullSecrets/0"),
        ({"devicePlugin": {"namespace": "Not_A_Name"}}, "/devicePlugin/namespace"),
        ({"operator": {"podLabels": {"team": 7}}}, "/operator/podLabels/team"),
        ({"webhook": {"certManager": {"enabled": "yes"}}}, "/webhook/certManager/enabled"),
        ({"webhook": {"certManager": {"duration": "90 days"}}}, "/webhook/certManager/duration"),
        ({"rbac": {"readers": [{"name": "alice"}]}}, "/rbac/readers/0"),
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
            RELEASE_NAMESPACE,
            "--create-namespace",
            "--values",
            str(values),
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "pod-security.kubernetes.io/enforce=privileged" in done.stdout  # the NOTES

    yield from installed_by(directory, install, namespaces=(RELEASE_NAMESPACE, RELEASE_NAMESPACE))


def run_helm(installed: Installed, binaries: Binaries, *args: str) -> str:
    done = helm(
        binaries,
        installed.kubeconfig.parent / "helm-home",
        *args,
        "--kubeconfig",
        str(installed.kubeconfig),
        "--namespace",
        RELEASE_NAMESPACE,
    )
    assert done.returncode == 0, done.stdout + done.stderr + installed.diagnosis()
    return done.stdout


def start_guide_pod(installed: Installed, directory: Path, name: str) -> dict[str, Any]:
    manifest = directory / f"{name}.yaml"
    guide = (MANIFESTS / "examples" / "gpu-pod1.yaml").read_text()
    manifest.write_text(guide.replace("name: gpu-pod1", f"name: {name}"))
    installed.kubectl("apply", "-f", str(manifest))
    return installed.running(name)


def test_helm_install_on_a_real_node_runs_the_guides_pods(installed: Installed) -> None:
    namespace = installed.get("namespace", RELEASE_NAMESPACE)
    assert "app.kubernetes.io/managed-by" not in namespace["metadata"].get("labels", {})
    for example in ("gpu-pod1.yaml", "gpu-pod2.yaml"):
        installed.kubectl("apply", "-f", str(MANIFESTS / "examples" / example))
    try:
        for pod in ("gpu-pod1", "gpu-pod2"):
            card = installed.running(pod)["metadata"]["annotations"][contract.GPU_INDEX]
            assert installed.gpu_env(pod) == {
                contract.ENV_VISIBLE_DEVICES: card,
                contract.ENV_GPU_ALLOCATED: "1024",
                contract.ENV_GPU_MEMORY_TOTAL: str(GUIDE_CARD_MIB),
            }
    finally:
        installed.kubectl("delete", "pod", "gpu-pod1", "gpu-pod2", "--ignore-not-found")


UPGRADE_COLUMN = {"name": "Upgraded", "type": "string", "jsonPath": ".spec.pluginVersion"}


def upgraded_chart(directory: Path) -> Path:
    """A copy of the chart whose next version adds a printer column to the GPUNode CRD."""
    chart = directory / "gpushare"
    shutil.copytree(CHART, chart)
    path = chart / "crds" / "gpunodes.gpushare.io.yaml"
    crd = yaml.safe_load(path.read_text())
    crd["spec"]["versions"][0]["additionalPrinterColumns"].append(UPGRADE_COLUMN)
    path.write_text(yaml.safe_dump(crd, sort_keys=False))
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = f"{meta['version']}-upgrade"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return chart


def columns(installed: Installed) -> list[dict[str, Any]]:
    crd = installed.get("crd", "gpunodes.gpushare.io")
    found: list[dict[str, Any]] = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    return found


def test_helm_upgrade_with_a_crd_change_keeps_a_gpu_pod_running(
    installed: Installed, binaries: Binaries, tmp_path: Path
) -> None:
    """The chart README's upgrade: the new CRDs applied server-side, then `helm upgrade`
    (a new log level, so both workloads roll) while a GPU pod runs."""
    before = start_guide_pod(installed, tmp_path, "upgrade-a")
    env = installed.gpu_env("upgrade-a")
    chart = upgraded_chart(tmp_path)
    assert UPGRADE_COLUMN not in columns(installed)
    try:
        applied = installed.kubectl(
            "apply", "--server-side", "--force-conflicts", "-f", str(chart / "crds")
        )
        assert "gpunodes.gpushare.io serverside-applied" in applied.stdout, applied.stdout
        run_helm(
            installed, binaries, "upgrade", "gpushare", str(chart), "--reuse-values",
            "--set", "logLevel=debug",
        )  # fmt: skip
        installed.rolled_out()
        assert UPGRADE_COLUMN in columns(installed)
        table = installed.kubectl("get", "gpunodes").stdout
        assert "UPGRADED" in table.splitlines()[0], table
        for kind, name in (
            ("deployment", "gpushare-operator"),
            ("daemonset", "gpushare-device-plugin"),
        ):
            workload = installed.get("-n", RELEASE_NAMESPACE, kind, name)
            assert env_of(workload)["GPUSHARE_LOG_LEVEL"] == "debug"
            pods = installed.get(
                "-n", RELEASE_NAMESPACE, "pods", "-l", f"app.kubernetes.io/name={name}"
            )["items"]
            live = [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]
            assert live, name
            for pod in live:
                assert env_of({"spec": {"template": pod}})["GPUSHARE_LOG_LEVEL"] == "debug"
        after = installed.running("upgrade-a")
        assert after["metadata"]["uid"] == before["metadata"]["uid"]
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0
        assert installed.gpu_env("upgrade-a") == env
        # The upgraded components place and serve a new pod.
        start_guide_pod(installed, tmp_path, "upgrade-b")
        assert installed.gpu_env("upgrade-b")[contract.ENV_GPU_ALLOCATED] == "1024"
        status = run_helm(installed, binaries, "status", "gpushare", "-o", "json")
        assert '"version":2' in status.replace(" ", "")
    finally:
        installed.kubectl("delete", "pod", "upgrade-a", "upgrade-b", "--ignore-not-found")


def test_helm_uninstall_removes_the_release_and_leaves_crds_namespace_and_running_pods(
    installed: Installed, binaries: Binaries, tmp_path: Path
) -> None:
    """The chart README's list, as the cluster shows it after `helm uninstall`; and what it
    says of installing again: a GPU pod made meanwhile (no webhook, no scheduler), its limit
    in units, is placed, labelled and runs with its card; one whose limit is MiB waits, told
    to be created again (the last test of the module)."""
    running = start_guide_pod(installed, tmp_path, "kept")
    env = installed.gpu_env("kept")
    run_helm(installed, binaries, "uninstall", "gpushare", "--wait")
    gone = {
        ("-n", RELEASE_NAMESPACE, "deployment", "gpushare-operator"),
        ("-n", RELEASE_NAMESPACE, "daemonset", "gpushare-device-plugin"),
        ("-n", RELEASE_NAMESPACE, "service", "gpushare-webhook"),
        ("-n", RELEASE_NAMESPACE, "serviceaccount", "gpushare-operator"),
        ("clusterrole", "gpushare-operator"),
        ("clusterrole", "gpushare-view"),
        ("clusterrolebinding", "gpushare-device-plugin"),
        ("mutatingwebhookconfiguration", "gpushare"),
        ("validatingadmissionpolicy", "gpushare-gpu-pods"),
        ("validatingadmissionpolicybinding", "gpushare-gpu-env"),
        ("flowschema", "gpushare-operator"),
    }
    for what in sorted(gone):
        assert installed.kubectl("get", *what, check=False).returncode != 0, what
    deadline = time.monotonic() + 120
    while installed.get("pods", "-n", RELEASE_NAMESPACE)["items"]:
        assert time.monotonic() < deadline, installed.diagnosis()
        time.sleep(1)
    assert installed.get("namespace", RELEASE_NAMESPACE)["status"]["phase"] == "Active"
    for kept in (
        ("crd", "gpunodes.gpushare.io"),
        ("crd", "gpushareconfigs.gpushare.io"),
        ("gpunodes", NODE),
        ("-n", RELEASE_NAMESPACE, "lease", "gpushare-scheduler"),
        ("-n", RELEASE_NAMESPACE, "secret", "gpushare-webhook-tls"),
    ):
        installed.get(*kept)
    after = installed.running("kept")
    assert after["metadata"]["uid"] == running["metadata"]["uid"]
    assert installed.gpu_env("kept") == env

    # GPU pods made while it is uninstalled: no webhook labels them or converts their limits.
    guide = (MANIFESTS / "examples" / "gpu-pod1.yaml").read_text()
    for name, limit in (("late", "2"), ("late-mib", "1024")):  # 2 units of 512 MiB; 1024 MiB
        manifest = tmp_path / f"{name}.yaml"
        written = guide.replace("name: gpu-pod1", f"name: {name}")
        manifest.write_text(written.replace("gpu-memory: 1024 ", f"gpu-memory: {limit} "))
        installed.kubectl("apply", "-f", str(manifest))
        labels = installed.get("pod", name)["metadata"].get("labels", {})
        assert contract.GPU_POD_LABEL not in labels
    # Installed again as the chart's README says: the CRDs (left, and taken over by kubectl
    # at the upgrade above) first, then the release without them.
    installed.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    values = values_file(tmp_path, DEV_VALUES)
    run_helm(installed, binaries, "install", "gpushare", str(CHART), "--skip-crds", "-f", values)
    installed.rolled_out()
    late = installed.running("late")
    assert late["metadata"]["labels"][contract.GPU_POD_LABEL] == contract.GPU_POD_LABEL_VALUE
    assert installed.gpu_env("late")[contract.ENV_GPU_ALLOCATED] == "1024"
    # The one written in MiB asks for 1024 devices of 512 MiB: it waits, told why and the fix.
    deadline = time.monotonic() + 60
    while "If they are MiB, delete the pod and create it again" not in str(
        installed.get("pod", "late-mib")["status"].get("conditions")
    ):
        assert time.monotonic() < deadline, installed.get("pod", "late-mib")["status"]
        time.sleep(1)
