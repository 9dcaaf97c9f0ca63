"""`make release` (`gpushare-dev release`): what an admin downloads, checked as far as no
registry is needed: checksums, image digests, the chart, the CLI wheel installed in a fresh
virtual environment, the kubectl plugin run from its archive, its krew manifest, the SBOMs."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import venv
from pathlib import Path

import pytest
import yaml

from gpushare_harness.binaries import ensure_binaries
from gpushare_harness.imagebuild import manifest_digest
from gpushare_harness.release import make_release, project_version

pytestmark = pytest.mark.integration

REGISTRY = "registry.example.test/gpu"


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    return make_release(out, registry=REGISTRY, download_url="https://example.test/v1", log=False)


def run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, check=False, cwd=cwd, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result


def test_every_artifact_is_versioned_and_its_checksum_listed(release: Path) -> None:
    version = project_version()
    assert release.name == version
    sums = {
        name: digest
        for digest, name in (
            line.split("  ", 1) for line in (release / "SHA256SUMS").read_text().splitlines()
        )
    }
    expected = {
        f"operator-{version}.oci.tar",
        f"device-plugin-{version}.oci.tar",
        f"gpushare-{version}.tgz",
        f"kube_gpushare-{version}-py3-none-any.whl",
        f"kubectl-gpushare-{version}.tar.gz",
        "gpushare.yaml",
        "images.json",
        f"operator-{version}.spdx.json",
        f"device-plugin-{version}.spdx.json",
        f"kubectl-gpushare-{version}.spdx.json",
    }
    assert set(sums) == expected
    for name, digest in sums.items():
        assert hashlib.sha256((release / name).read_bytes()).hexdigest() == digest, name


def test_the_images_are_named_at_the_registry_with_their_manifest_digests(release: Path) -> None:
    images = json.loads((release / "images.json").read_text())
    assert set(images) == {"operator", "device-plugin"}
    for component, image in images.items():
        assert image["image"] == f"{REGISTRY}/{component}:{project_version()}"
        assert image["digest"] == manifest_digest(release / image["archive"])
        assert image["digest"].startswith("sha256:")


def test_the_chart_package_pulls_the_released_images(release: Path) -> None:
    helm = ensure_binaries().helm
    rendered = run(helm, "template", "gpushare", release / f"gpushare-{project_version()}.tgz")
    images = {
        container["image"]
        for document in yaml.safe_load_all(rendered.stdout)
        if document and document.get("kind") in ("Deployment", "DaemonSet")
        for container in document["spec"]["template"]["spec"]["containers"]
    }
    version = project_version()
    assert images == {f"{REGISTRY}/operator:{version}", f"{REGISTRY}/device-plugin:{version}"}


def test_the_wheel_installs_the_cli_under_our_distribution_name(
    release: Path, tmp_path: Path
) -> None:
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    (wheel,) = release.glob("kube_gpushare-*.whl")
    constraints = Path(__file__).resolve().parents[2] / "docker" / "constraints.txt"
    run(python, "-m", "pip", "install", "--quiet", "--constraint", constraints, wheel)
    shown = run(python, "-m", "pip", "show", "kube-gpushare").stdout
    assert f"Version: {project_version()}" in shown
    assert project_version() in run(tmp_path / "venv" / "bin" / "gpushare", "--version").stdout
    assert "kopf" not in run(python, "-m", "pip", "list").stdout  # the CLI alone


def test_the_kubectl_plugin_runs_from_its_archive_as_krew_installs_it(
    release: Path, tmp_path: Path
) -> None:
    archive = release / f"kubectl-gpushare-{project_version()}.tar.gz"
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["LICENSE", "kubectl-gpushare"]
        tar.extractall(tmp_path, filter="data")
    plugin = tmp_path / "kubectl-gpushare"
    # As kubectl runs it: the file itself, through its shebang (python3 on PATH).
    helped = run(plugin, "--help", cwd=tmp_path)
    assert "usage: kubectl gpushare" in helped.stdout  # named as kubectl calls it
    assert project_version() in run(sys.executable, plugin, "--version").stdout

    manifest = yaml.safe_load((release / "gpushare.yaml").read_text())
    assert manifest["kind"] == "Plugin"
    assert manifest["spec"]["version"] == f"v{project_version()}"
    for platform in manifest["spec"]["platforms"]:
        assert platform["uri"] == f"https://example.test/v1/{archive.name}"
        assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
        assert platform["bin"] == "kubectl-gpushare"


def test_the_sboms_list_each_images_debian_and_python_packages(release: Path) -> None:
    def purls(name: str) -> set[str]:
        document = json.loads((release / name).read_text())
        assert document["spdxVersion"] == "SPDX-2.3"
        return {ref["referenceLocator"] for p in document["packages"] for ref in p["externalRefs"]}

    version = project_version()
    plugin_image = purls(f"device-plugin-{version}.spdx.json")
    operator_image = purls(f"operator-{version}.spdx.json")
    cli = purls(f"kubectl-gpushare-{version}.spdx.json")
    assert any(p.startswith("pkg:deb/debian/python3.11@") for p in plugin_image)
    assert any(p.startswith("pkg:pypi/grpcio@") for p in plugin_image)
    assert not any(p.startswith("pkg:pypi/kopf@") for p in plugin_image)
    assert any(p.startswith("pkg:pypi/kopf@") for p in operator_image)
    assert f"pkg:pypi/kube-gpushare@{version}" in cli
    assert any(p.startswith("pkg:pypi/kubernetes-asyncio@") for p in cli)
