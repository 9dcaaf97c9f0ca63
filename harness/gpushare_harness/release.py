"""`gpushare-dev release` (`make release`): the versioned artifacts an admin installs from,
written to `dist/<version>/`, with nothing pushed anywhere:

- `operator-<v>.oci.tar`, `device-plugin-<v>.oci.tar`: the images, built from
  docker/*.Dockerfile (`imagebuild`), as OCI archives (`skopeo copy oci-archive:...`);
- `images.json`: each image's name at `--registry` and its manifest digest;
- `gpushare-<v>.tgz`: the Helm chart, its image repositories set to `--registry`;
- `kube_gpushare-<v>-py3-none-any.whl`: the CLI (the distribution `kube-gpushare`; the name
  `gpushare` on PyPI is another project's);
- `kubectl-gpushare-<v>.tar.gz` and `gpushare.yaml`: the kubectl plugin (one zipapp that runs
  on any python3 >= 3.11, its dependencies inside as pure Python) and its krew manifest;
- `*.spdx.json`: an SPDX 2.3 SBOM of each image (Debian and Python packages) and of the
  plugin's archive;
- `SHA256SUMS` of every file above.
"""

from __future__ import annotations

import compileall
import hashlib
import json
import py_compile
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipapp
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

import yaml

from gpushare_harness.binaries import ensure_binaries
from gpushare_harness.imagebuild import ROOT, build_images, layer_files, manifest_digest

CHART = ROOT / "charts" / "gpushare"
CONSTRAINTS = ROOT / "docker" / "constraints.txt"
DEFAULT_REGISTRY = "localhost/gpushare"
PLUGIN = "kubectl-gpushare"
_PLATFORMS = [(os, arch) for os in ("linux", "darwin") for arch in ("amd64", "arm64")]


class ReleaseError(RuntimeError):
    """The release cannot be made; the message names the step and the fix."""


@dataclass(frozen=True)
class Package:
    """One package in an SBOM."""

    name: str
    version: str
    purl: str


def project_version() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return str(project["version"])


def make_release(
    out: Path,
    *,
    registry: str = DEFAULT_REGISTRY,
    download_url: str | None = None,
    log: bool = True,
) -> Path:
    """Every artifact of this version in `out/<version>/` (replaced); that folder.
    `download_url`: where the plugin's archive will be published (the krew manifest's `uri`);
    default: the archive's own path, for `kubectl krew install --manifest --archive`."""
    version = project_version()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    if (str(chart["version"]), str(chart["appVersion"])) != (version, version):
        raise ReleaseError(
            f"charts/gpushare/Chart.yaml says version {chart['version']}, appVersion "
            f"{chart['appVersion']}; pyproject.toml says {version}: make them one version"
        )
    folder = out / version
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    images: dict[str, dict[str, object]] = {}
    for component, image in build_images(log=log).items():
        archive = folder / f"{component}-{version}.oci.tar"
        shutil.copyfile(image.archive, archive)
        name = f"{registry}/{component}:{version}"
        digest = manifest_digest(archive)
        images[component] = {
            "image": name,
            "digest": digest,
            "archive": archive.name,
            "unpackedBytes": image.size_bytes,
        }
        _write_sbom(folder / f"{component}-{version}.spdx.json", name, _image_packages(archive))
    (folder / "images.json").write_text(json.dumps(images, indent=2) + "\n")
    _package_chart(folder, registry, version)
    wheel = _build_wheel(folder)
    plugin = _build_plugin(folder, wheel, version)
    _write_krew_manifest(folder, plugin, version, download_url)
    _write_checksums(folder)
    if log:
        print(f"release {version}: {folder}", flush=True)
    return folder


def _run(argv: list[str], *, step: str, cwd: Path | None = None) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=cwd)
    if result.returncode != 0:
        raise ReleaseError(f"{step} failed ({' '.join(argv[:3])} ...):\n{result.stderr[-3000:]}")
    return result.stdout


def _package_chart(folder: Path, registry: str, version: str) -> None:
    """The chart with its images at `registry` (what an admin pulls from after pushing)."""
    with tempfile.TemporaryDirectory() as staging:
        staged = Path(staging) / "gpushare"
        shutil.copytree(CHART, staged)
        values = (staged / "values.yaml").read_text()
        for component in ("operator", "device-plugin"):
            values, count = re.subn(
                rf"(repository: )\S+/{component}\b", rf"\g<1>{registry}/{component}", values
            )
            if count != 1:
                raise ReleaseError(f"values.yaml names the {component} image {count} times")
        (staged / "values.yaml").write_text(values)
        helm = ensure_binaries().helm
        _run([str(helm), "lint", str(staged)], step="helm lint")
        _run([str(helm), "package", str(staged), "--destination", str(folder)], step="helm package")
    if not (folder / f"gpushare-{version}.tgz").is_file():
        raise ReleaseError(f"helm package wrote no gpushare-{version}.tgz")


def _build_wheel(folder: Path) -> Path:
    with tempfile.TemporaryDirectory() as staging:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--quiet",
                "-w",
                staging,
                str(ROOT),
            ],
            step="pip wheel",
        )
        (built,) = Path(staging).glob("kube_gpushare-*.whl")
        return Path(shutil.copy(built, folder))


def _build_plugin(folder: Path, wheel: Path, version: str) -> Path:
    """The kubectl plugin: a zipapp of the CLI and its dependencies, compiled extensions left
    out (each of them falls back to its pure-Python code), bytecode beside the sources so
    that CPython 3.11 starts it without compiling (others compile the sources)."""
    with tempfile.TemporaryDirectory() as staging:
        app = Path(staging) / "app"
        _run(
            [
                sys.executable, "-m", "pip", "install", "--quiet", "--no-compile",
                "--target", str(app), "--constraint", str(CONSTRAINTS), str(wheel),
            ],
            step="pip install (the plugin's dependencies)",
        )  # fmt: skip
        shutil.rmtree(app / "bin", ignore_errors=True)
        for extension in [*app.rglob("*.so"), *app.rglob("*.pyd")]:
            extension.unlink()
        (app / "__main__.py").write_text(
            "from gpushare_cli.main import main\n\nraise SystemExit(main())\n"
        )
        compileall.compile_dir(
            app,
            quiet=1,
            legacy=True,  # zipimport reads bytecode beside the source only
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
        packages = _python_packages(app)
        executable = Path(staging) / PLUGIN
        zipapp.create_archive(app, executable, interpreter="/usr/bin/env python3", compressed=True)
        archive = folder / f"{PLUGIN}-{version}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(executable, arcname=PLUGIN, filter=_normalized)
            tar.add(ROOT / "LICENSE", arcname="LICENSE", filter=_normalized)
    _write_sbom(folder / f"{PLUGIN}-{version}.spdx.json", f"{PLUGIN} {version}", packages)
    return archive


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.name == PLUGIN else 0o644
    return info


def _write_krew_manifest(folder: Path, archive: Path, version: str, url: str | None) -> None:
    sha256 = _sha256(archive)
    uri = f"{url.rstrip('/')}/{archive.name}" if url else archive.resolve().as_uri()
    manifest = {
        "apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
        "kind": "Plugin",
        "metadata": {"name": "gpushare"},
        "spec": {
            "version": f"v{version}",
            "shortDescription": "Show what GPU cards hold and why a GPU pod waits",
            "description": (
                "gpushare's CLI: cards per node (used/total MiB, health), why a pod waits, "
                "card by card, where a pod would go, and the fewest moves that let waiting "
                "pods fit. Needs python3 3.11 or later on PATH."
            ),
            "caveats": "Needs python3 (3.11 or later) on PATH.",
            "platforms": [
                {
                    "selector": {"matchLabels": {"os": os, "arch": arch}},
                    "uri": uri,
                    "sha256": sha256,
                    "bin": PLUGIN,
                }
                for os, arch in _PLATFORMS
            ],
        },
    }
    (folder / "gpushare.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))


def _write_checksums(folder: Path) -> None:
    lines = [f"{_sha256(path)}  {path.name}" for path in sorted(folder.iterdir()) if path.is_file()]
    (folder / "SHA256SUMS").write_text("\n".join(lines) + "\n")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# -- SBOMs -----------------------------------------------------------------------------------


def _image_packages(archive: Path) -> list[Package]:
    """The Debian packages (dpkg's status) and Python distributions (dist-info) in an image."""
    packages: list[Package] = []
    for name, content in layer_files(archive, _in_sbom):
        if name.endswith("var/lib/dpkg/status"):
            packages += _debian_packages(content.decode())
        else:
            packages.append(_python_package(content.decode()))
    return sorted(set(packages), key=lambda p: (p.purl, p.version))


def _in_sbom(name: str) -> bool:
    return name.endswith("var/lib/dpkg/status") or (
        ".dist-info/" in name and name.endswith("/METADATA")
    )


def _debian_packages(status: str) -> Iterator[Package]:
    for stanza in status.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if "Package" not in fields or "installed" not in fields.get("Status", ""):
            continue
        name, version = fields["Package"], fields["Version"]
        arch = fields.get("Architecture", "all")
        yield Package(name, version, f"pkg:deb/debian/{name}@{version}?arch={arch}")


def _python_packages(site: Path) -> list[Package]:
    return sorted(
        (_python_package(path.read_text()) for path in site.glob("*.dist-info/METADATA")),
        key=lambda p: p.purl,
    )


def _python_package(metadata: str) -> Package:
    headers = HeaderParser().parsestr(metadata)
    name, version = str(headers["Name"]), str(headers["Version"])
    normalized = re.sub(r"[-_.]+", "-", name).lower()
    return Package(name, version, f"pkg:pypi/{normalized}@{version}")


def _write_sbom(path: Path, subject: str, packages: Iterable[Package]) -> None:
    listed = list(packages)
    ids = [f"SPDXRef-Package-{index}" for index in range(len(listed))]
    document = {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": subject,
        "documentNamespace": f"urn:uuid:gpushare:{hashlib.sha256(subject.encode()).hexdigest()}",
        "creationInfo": {
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "creators": ["Tool: gpushare-dev release"],
        },
        "packages": [
            {
                "name": package.name,
                "SPDXID": spdx_id,
                "versionInfo": package.version,
                "downloadLocation": "NOASSERTION",
                "filesAnalyzed": False,
                "externalRefs": [
                    {
                        "referenceCategory": "PACKAGE-MANAGER",
                        "referenceType": "purl",
                        "referenceLocator": package.purl,
                    }
                ],
            }
            for package, spdx_id in zip(listed, ids, strict=True)
        ],
        "relationships": [
            {
                "spdxElementId": "SPDXRef-DOCUMENT",
                "relationshipType": "DESCRIBES",
                "relatedSpdxElement": spdx_id,
            }
            for spdx_id in ids
        ],
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
