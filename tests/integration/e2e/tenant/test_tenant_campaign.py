"""The tenant campaign: gpushare installed on a real node as an admin installs it (its
admission policies included), and a tenant, a ServiceAccount with the built-in `edit` role in
one namespace and nothing cluster-wide, that tries every edit of the placement record and of
the GPU env it can think of (hypothesis-generated: every volcano.sh/* placement annotation and
gpushare.io/* annotation set, changed or removed, through the pod and its subresources, on
pending, bound and running pods, and the label gpushare.io/gpu-pod that puts them under the
placement policy removed or changed; NVIDIA_*, VOLCANO_GPU_* and
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in new pods and in ephemeral containers). Each edit is
refused at the apiserver, naming the fix, and changes nothing; afterwards no card holds more
than its size, every running container's env equals its grant, and no pod waits without a
reason."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from installs import GUIDE_CARD_MIB, MANIFESTS, NODE, Installed, installed_by
from kubernetes_asyncio import client

from gpushare import kube
from gpushare.model import contract
from gpushare.model.gangs import COSCHEDULING_GROUP_LABEL, VOLCANO_GROUP_ANNOTATIONS
from gpushare_harness.identities import tenant_kubeconfig

pytestmark = [pytest.mark.integration]

TENANT = "tenant-a"
PLACEMENT_KEYS = (
    contract.GPU_INDEX,
    contract.PREDICATE_TIME,
    contract.GPU_ASSIGNED,
    contract.MEMORY_UNIT_MIB,
    contract.GPU_MEMORY_MIB,
    contract.GANG_MIN_MEMBER,  # what preemption holds a gang to
    "gpushare.io/anything",
    *VOLCANO_GROUP_ANNOTATIONS,  # a gang joined after creation
)
VALUES = st.one_of(
    st.sampled_from(
        [
            *("0", "1", "7", "0,1", "", "true", "false", "512", "cuda-container=11178"),
            *("99999999999999999999", "main=99999"),
        ]
    ),
    st.text(alphabet="abcxyz0123456789,=-", max_size=12),
)
PODS_IN_EACH_STATE = st.sampled_from(["running-a", "running-b", "bound", "pending"])
ROUTES = st.sampled_from(["annotate", "patch", "status", "replace"])
"""How an edit is sent: kubectl annotate (or label), a merge patch of the pod or of its
status, a replace of the whole pod."""
CAMPAIGN = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
GPU_ENV = st.sampled_from(
    [
        contract.ENV_VISIBLE_DEVICES,
        contract.ENV_GPU_ALLOCATED,
        contract.ENV_GPU_MEMORY_TOTAL,
        "NVIDIA_DRIVER_CAPABILITIES",
        "VOLCANO_GPU_ANYTHING",
        contract.ENV_MPS_MEM_LIMIT,
    ]
)


class Tenant:
    """The tenant's kubectl: its own token, its own namespace."""

    def __init__(self, installed: Installed, kubeconfig: Path, directory: Path) -> None:
        self.installed = installed
        self.kubeconfig = kubeconfig
        self.directory = directory

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        assert self.installed.cluster.plane is not None
        kubectl = self.installed.cluster.plane.binaries.kubectl
        return subprocess.run(
            [str(kubectl), "--kubeconfig", str(self.kubeconfig), "-n", TENANT, *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            input=stdin,
        )

    def create(self, pod: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return self.kubectl("create", "-f", "-", stdin=json.dumps(pod))

    def pod(self, name: str) -> dict[str, Any]:
        found = self.kubectl("get", "pod", name, "-o", "json")
        assert found.returncode == 0, found.stderr
        pod: dict[str, Any] = json.loads(found.stdout)
        return pod

    def annotations(self, name: str) -> dict[str, str]:
        return dict(self.pod(name)["metadata"].get("annotations") or {})


def gpu_pod(name: str, mib: int = 1024, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulerName": "volcano",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "cuda-container",
                    "image": "nvidia/cuda:9.0-devel",
                    "command": ["sleep", "100000"],
                    "resources": {"limits": {contract.GPU_MEMORY: str(mib)}},
                }
            ],
            **spec,
        },
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    def apply(target: Installed) -> None:
        target.kubectl("apply", "-k", str(MANIFESTS / "overlays" / "dev"))

    yield from installed_by(tmp_path_factory.mktemp("tenant"), apply)


@pytest.fixture(scope="module")
def tenant(installed: Installed, tmp_path_factory: pytest.TempPathFactory) -> Tenant:
    installed.kubectl("create", "namespace", TENANT)
    directory = tmp_path_factory.mktemp("tenant-a")

    async def kubeconfig() -> Path:
        async with await kube.api_client(installed.kubeconfig) as api:
            return await tenant_kubeconfig(
                client.CoreV1Api(api), installed.kubeconfig, TENANT, directory / "kubeconfig"
            )

    return Tenant(installed, asyncio.run(kubeconfig()), directory)


@pytest.fixture(scope="module")
def pods(tenant: Tenant) -> dict[str, int]:
    """The tenant's pods in each state, by name: running, bound but not running (an init
    container that sleeps: admitted, its card given), and pending (a scheduling gate)."""
    states = {
        "running-a": gpu_pod("running-a"),
        "running-b": gpu_pod("running-b", 2048),
        "bound": gpu_pod(
            "bound",
            initContainers=[
                {"name": "hold", "image": "nvidia/cuda:9.0-devel", "command": ["sleep", "100000"]}
            ],
        ),
        "pending": gpu_pod("pending", schedulingGates=[{"name": "tenant.example/hold"}]),
    }
    for pod in states.values():
        created = tenant.create(pod)
        assert created.returncode == 0, created.stderr
    for name in ("running-a", "running-b"):
        wait_for(
            f"{name} Running", lambda n=name: tenant.pod(n)["status"].get("phase") == "Running"
        )
    wait_for("bound admitted", lambda: tenant.pod("bound")["status"].get("initContainerStatuses"))
    return {"running-a": 1024, "running-b": 2048, "bound": 1024, "pending": 1024}


def placement_of(tenant: Tenant, names: list[str]) -> dict[str, dict[str, str]]:
    return {
        name: {
            k: v
            for k, v in tenant.annotations(name).items()
            if k.startswith(("volcano.sh/", "gpushare.io/")) or k in VOLCANO_GROUP_ANNOTATIONS
        }
        for name in names
    }


def wait_for(what: str, check: Any, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} never came"
        time.sleep(1)


def gpu_env(tenant: Tenant, name: str) -> dict[str, str]:
    result = tenant.kubectl("exec", name, "-c", "cuda-container", "--", "env")
    assert result.returncode == 0, result.stderr
    env = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return {k: v for k, v in env.items() if k.startswith(("NVIDIA_", "VOLCANO_GPU_"))}


def try_edit(
    tenant: Tenant,
    name: str,
    key: str,
    value: str | None,
    route: str,
    *,
    field: str = "annotations",
) -> str:
    """Try one edit of annotation `key` (or label, `field` "labels"; None: remove it) through
    `route`; the refusal."""
    patch = json.dumps({"metadata": {field: {key: value}}})
    if route == "annotate":  # or label
        target = f"{key}-" if value is None else f"{key}={value}"
        verb = "annotate" if field == "annotations" else "label"
        result = tenant.kubectl(verb, "pod", name, target, "--overwrite")
    elif route == "replace":
        pod = tenant.pod(name)
        values = pod["metadata"].setdefault(field, {})
        if value is None:
            values.pop(key, None)
        else:
            values[key] = value
        result = tenant.kubectl("replace", "-f", "-", stdin=json.dumps(pod))
    else:  # a merge patch of the pod, or of its status (which may change annotations)
        extra = ["--subresource", "status"] if route == "status" else []
        result = tenant.kubectl("patch", "pod", name, "--type", "merge", "-p", patch, *extra)
    return result.stderr if result.returncode else ""


@settings(CAMPAIGN, max_examples=40)
@given(
    edit=st.tuples(
        PODS_IN_EACH_STATE,
        st.sampled_from(PLACEMENT_KEYS),
        st.one_of(st.none(), VALUES),
        ROUTES,
    )
)
def test_every_edit_of_a_pods_placement_record_is_refused_and_changes_nothing(
    tenant: Tenant, pods: dict[str, int], edit: tuple[str, str, str | None, str]
) -> None:
    target, key, value, route = edit
    before = placement_of(tenant, [target])
    refusal = try_edit(tenant, target, key, value, route)
    assert placement_of(tenant, [target]) == before
    if before[target].get(key) != value:  # a change, not the same value again
        assert refusal, f"{route} of {key}={value!r} on {target} was accepted"
    if refusal:
        assert "gpushare" in refusal or "cannot patch resource" in refusal, refusal
        if "gpushare-pod-placement" in refusal:
            assert "delete it and create it anew" in refusal


@settings(CAMPAIGN, max_examples=12)
@given(
    edit=st.tuples(
        PODS_IN_EACH_STATE,
        st.one_of(st.none(), st.sampled_from(["false", "no", "true"])),
        ROUTES,
    )
)
def test_no_edit_takes_a_gpu_pod_out_of_the_placement_policy(
    tenant: Tenant, pods: dict[str, int], edit: tuple[str, str | None, str]
) -> None:
    target, value, route = edit
    before = tenant.pod(target)["metadata"]["labels"]
    assert before[contract.GPU_POD_LABEL] == contract.GPU_POD_LABEL_VALUE
    refusal = try_edit(tenant, target, contract.GPU_POD_LABEL, value, route, field="labels")
    assert tenant.pod(target)["metadata"]["labels"] == before
    rbac = 'cannot patch resource "pods/status"'  # `edit` grants no status writes
    if route == "status":
        assert rbac in refusal, refusal
    elif value == contract.GPU_POD_LABEL_VALUE:  # no change: the policy lets it through
        assert refusal == "", refusal
    else:
        assert f"label {contract.GPU_POD_LABEL} of a pod belong to gpushare's record" in refusal


@settings(CAMPAIGN, max_examples=8)
@given(
    edit=st.tuples(
        PODS_IN_EACH_STATE, st.one_of(st.none(), st.sampled_from(["g", "other"])), ROUTES
    )
)
def test_no_pod_joins_a_gang_after_its_creation(
    tenant: Tenant, pods: dict[str, int], edit: tuple[str, str | None, str]
) -> None:
    # Joined later, a bound pod would tie its fate to a gang's in preemption (evicting one
    # member costs the whole gang), so that preemption turns to other tenants' pods.
    target, value, route = edit
    before = tenant.pod(target)["metadata"].get("labels", {})
    refusal = try_edit(tenant, target, COSCHEDULING_GROUP_LABEL, value, route, field="labels")
    assert tenant.pod(target)["metadata"].get("labels", {}) == before
    if route == "status":
        assert 'cannot patch resource "pods/status"' in refusal, refusal
    elif value is not None:
        assert f"label {COSCHEDULING_GROUP_LABEL} of a pod belong to gpushare's record" in refusal


@settings(CAMPAIGN, max_examples=20)
@given(
    name=GPU_ENV,
    value=st.sampled_from(["all", "0", "0,1,2,3,4,5,6,7", "99999", "void"]),
    where=st.sampled_from(["container", "init", "no-gpu-limit", "ephemeral"]),
)
def test_no_container_may_set_the_variables_that_name_its_cards(
    tenant: Tenant, pods: dict[str, int], name: str, value: str, where: str
) -> None:
    if where == "ephemeral":
        result = tenant.kubectl(
            "debug", "running-a", "--image=nvidia/cuda:9.0-devel", f"--env={name}={value}",
            "--", "sleep", "1",
        )  # fmt: skip
        assert result.returncode != 0
        assert "gpu-env" in result.stderr or "forbidden" in result.stderr, result.stderr
        return
    pod = gpu_pod("env-probe")
    container = pod["spec"]["containers"][0]
    if where == "no-gpu-limit":
        del container["resources"]
        pod["spec"].pop("schedulerName")
    variable = [{"name": name, "value": value}]
    if where == "init":
        pod["spec"]["initContainers"] = [
            {"name": "init", "image": "nvidia/cuda:9.0-devel", "command": ["true"], "env": variable}
        ]
    else:
        container["env"] = variable
    result = tenant.create(pod)
    assert result.returncode != 0, "a pod that names its own cards was created"
    assert f"sets {name}" in result.stderr, result.stderr
    assert "Remove these variables from env" in result.stderr


def test_after_the_campaign_every_card_and_env_is_as_granted(
    tenant: Tenant, pods: dict[str, int], installed: Installed
) -> None:
    for name in ("running-a", "running-b"):
        card = tenant.annotations(name)[contract.GPU_INDEX]
        assert gpu_env(tenant, name) == {
            contract.ENV_VISIBLE_DEVICES: card,
            contract.ENV_GPU_ALLOCATED: str(pods[name]),
            contract.ENV_GPU_MEMORY_TOTAL: str(GUIDE_CARD_MIB),
        }
    # The gated pod, ungated: placed and told exactly what it asked.
    ungated = tenant.kubectl(
        "patch", "pod", "pending", "--type", "json",
        "-p", '[{"op": "remove", "path": "/spec/schedulingGates"}]',
    )  # fmt: skip
    assert ungated.returncode == 0, ungated.stderr
    # A new pod of each size edited above: placed and started (no node refuses a size).
    for name, mib in (("after-a", 1024), ("after-b", 2048)):
        created = tenant.create(gpu_pod(name, mib))
        assert created.returncode == 0, created.stderr
    for name, mib in (("pending", 1024), ("after-a", 1024), ("after-b", 2048)):
        wait_for(
            f"{name} Running", lambda n=name: tenant.pod(n)["status"].get("phase") == "Running"
        )
        card = tenant.annotations(name)[contract.GPU_INDEX]
        assert gpu_env(tenant, name) == {
            contract.ENV_VISIBLE_DEVICES: card,
            contract.ENV_GPU_ALLOCATED: str(mib),
            contract.ENV_GPU_MEMORY_TOTAL: str(GUIDE_CARD_MIB),
        }
    # No card over its size, and the books list each pod on the card its env names.
    names = ["running-a", "running-b", "bound", "pending", "after-a", "after-b"]
    expected = {
        (f"{TENANT}/{name}", int(tenant.annotations(name)[contract.GPU_INDEX])) for name in names
    }

    def books() -> set[tuple[str, int]] | None:
        status = installed.get("gpunodes", NODE).get("status") or {}
        cards = status.get("cards") or []
        for card in cards:
            assert card["allocatedMiB"] + card["freeMiB"] <= GUIDE_CARD_MIB, card
        listed = {(pod, card["index"]) for card in cards for pod in card["pods"]}
        return listed if listed == expected else None

    wait_for("the GPUNode status to list every pod on its card", books, timeout_s=30)
    # No pod waits without a reason: every pod of the tenant runs or says why it waits.
    for pod in json.loads(tenant.kubectl("get", "pods", "-o", "json").stdout)["items"]:
        if pod["status"].get("phase") == "Running":
            continue
        conditions = {c["type"]: c for c in pod["status"].get("conditions", [])}
        assert pod["metadata"]["name"] == "bound" or conditions.get("PodScheduled", {}).get(
            "message"
        ), pod["status"]
