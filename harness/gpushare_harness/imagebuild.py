"""The project's own images, built here from docker/*.Dockerfile as an admin would build them,
with no container engine and no registry.

- The base: `mmdebstrap` makes Debian bookworm (Python 3.11) from Debian's packages, without
  docs, locales or apt's lists, and buildah commits it as `localhost/gpushare/base`.
- Each Dockerfile is built by Debian's `buildah` with `--build-arg BASE=` that base (the
  Dockerfiles default to the public `python:3.11-slim`, so the same file builds on a laptop),
  chroot isolation, the host's network for pip, and the host's CA bundle bound read-only
  for the build only (the registries here are reached through an authority the host trusts).
- Each image is written as an OCI archive that `ctr images import` takes.

Everything lives under the cache: the base by its recipe, the images by a hash of what goes
into them (Dockerfiles, constraints, pyproject, the shipped source roots). buildah's storage
is a folder of its own per build, removed afterwards (vfs: no mounts to leave behind).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from gpushare_harness.binaries import cache_dir

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.1.0"
REPOSITORY = "localhost/gpushare"
DOCKERFILES = {
    "operator": ROOT / "docker" / "operator.Dockerfile",
    "device-plugin": ROOT / "docker" / "device-plugin.Dockerfile",
}
SIZE_GOAL_BYTES = 200 * 1000**2
"""What an image may weigh unpacked (the issue's goal: 200 MB)."""
# Debian bookworm is Python 3.11; libstdc++ is for gRPC (the essential variant leaves it out).
_BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "libstdc++6")
_BASE_EXCLUDES = (
    "/usr/share/doc/*",
    "/usr/share/man/*",
    "/usr/share/info/*",
    "/usr/share/locale/*",
    "/usr/share/lintian/*",
    # glibc's iconv character sets: Python converts with its own codecs (8 MB).
    "/usr/lib/x86_64-linux-gnu/gconv/*",
)
_SOURCE_ROOTS = ("core", "operator", "device_plugin", "cli")
_HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# Written by buildah outside its --root; removed after a build when it was not there before.
_BUILDAH_LEFTOVERS = (Path("/var/lib/containers"), Path("/run/containers"))


class ImageBuildError(RuntimeError):
    """An image cannot be built; the message names the tool or the step, and the fix."""


@dataclass(frozen=True)
class BuiltImage:
    component: str
    name: str
    archive: Path
    size_bytes: int
    """Unpacked: the sum of its layers as a runtime stores them."""

    @property
    def archive_bytes(self) -> int:
        return self.archive.stat().st_size


def image_name(component: str) -> str:
    return f"{REPOSITORY}/{component}:{VERSION}"


def build_images(*, base: Path | None = None, log: bool = True) -> dict[str, BuiltImage]:
    """Both images, from the cache when nothing that goes into them has changed. `base`: an
    OCI archive of another base image (a pulled python:3.11-slim, say) instead of the Debian
    one made here."""
    for tool, package in (("buildah", "buildah"), ("mmdebstrap", "mmdebstrap")):
        if shutil.which(tool) is None:
            raise ImageBuildError(
                f"{tool} is missing: apt-get install {package} (or `make node-packages`)"
            )
    if base is not None and not base.is_file():
        raise ImageBuildError(f"the base image archive {base} does not exist")
    folder = cache_dir() / "images" / _inputs_digest(base)
    built = _read_built(folder)
    if built is not None:
        return built
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="build-", dir=folder.parent))
    try:
        with _buildah_storage() as buildah:
            if base is None:
                made = _base_archive(log=log)
                base_name = f"{REPOSITORY}/base:bookworm-{made.stem.rsplit('-', 1)[-1]}"
                _import_base(buildah, made, base_name)
            else:
                base_name = f"{REPOSITORY}/base:given-{folder.name}"
                pulled = _run([*buildah, "pull", f"oci-archive:{base}"], step="buildah pull")
                _run([*buildah, "tag", pulled.split()[-1], base_name], step="buildah tag")
            images = {}
            for component, dockerfile in DOCKERFILES.items():
                if log:
                    print(f"building {image_name(component)} from {dockerfile.name}", flush=True)
                archive = staging / f"{component}.oci.tar"
                _build(buildah, dockerfile, base_name, image_name(component), archive)
                images[component] = {
                    "name": image_name(component),
                    "archive": archive.name,
                    "size_bytes": unpacked_size(archive),  # once: it reads every layer
                }
        (staging / "images.json").write_text(json.dumps(images, indent=2))
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for older in folder.parent.iterdir() if base is None else ():
        # Images of earlier sources are never used again.
        if older.is_dir() and (older / "images.json").is_file() and older != folder:
            shutil.rmtree(older, ignore_errors=True)
    result = _read_built(folder)
    assert result is not None
    return result


def _inputs_digest(base: Path | None) -> str:
    digest = hashlib.sha256(repr((_BASE_PACKAGES, _BASE_EXCLUDES, VERSION)).encode())
    files = [ROOT / "pyproject.toml", ROOT / "README.md", ROOT / "docker" / "constraints.txt"]
    files += [base] if base is not None else []
    files += DOCKERFILES.values()
    for root in _SOURCE_ROOTS:
        files += sorted(
            p for p in (ROOT / root).rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
    for file in files:
        name = file.relative_to(ROOT) if file.is_relative_to(ROOT) else file.name
        digest.update(str(name).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def _read_built(folder: Path) -> dict[str, BuiltImage] | None:
    index = folder / "images.json"
    if not index.is_file():
        return None
    images = json.loads(index.read_text())
    return {
        component: BuiltImage(
            component=component,
            name=entry["name"],
            archive=folder / entry["archive"],
            size_bytes=entry["size_bytes"],
        )
        for component, entry in images.items()
    }


def manifest_digest(archive: Path) -> str:
    """The digest of an OCI archive's image manifest (what a registry names it by)."""
    with tarfile.open(archive) as oci:
        return str(json.load(_member(oci, "index.json"))["manifests"][0]["digest"])


@contextlib.contextmanager
def _layers(archive: Path) -> Iterator[Iterator[IO[bytes] | gzip.GzipFile]]:
    """The archive's layers in order, each as an uncompressed stream."""
    with tarfile.open(archive) as oci:
        index = json.load(_member(oci, "index.json"))
        manifest = json.load(_blob(oci, index["manifests"][0]["digest"]))

        def streams() -> Iterator[IO[bytes] | gzip.GzipFile]:
            for layer in manifest["layers"]:
                blob = _blob(oci, layer["digest"])
                gzipped = layer["mediaType"].endswith("gzip")
                yield gzip.GzipFile(fileobj=blob) if gzipped else blob

        yield streams()


def unpacked_size(archive: Path) -> int:
    """The size of an OCI archive's layers, uncompressed."""
    total = 0
    with _layers(archive) as layers:
        for stream in layers:
            while chunk := stream.read(1 << 20):
                total += len(chunk)
    return total


def layer_files(archive: Path, wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """The regular files of the image's layers whose path `wanted` takes, with their content
    (a file a later layer writes again comes again)."""
    with _layers(archive) as layers:
        for stream in layers:
            with tarfile.open(fileobj=stream, mode="r|") as layer:
                for member in layer:
                    if member.isfile() and wanted(member.name):
                        content = layer.extractfile(member)
                        if content is not None:
                            yield member.name, content.read()


def _member(oci: tarfile.TarFile, name: str) -> IO[bytes]:
    found = oci.extractfile(name)
    if found is None:
        raise ImageBuildError(f"{name} is missing from an OCI archive")
    return found


def _blob(oci: tarfile.TarFile, digest: str) -> IO[bytes]:
    algorithm, value = digest.split(":", 1)
    return _member(oci, f"blobs/{algorithm}/{value}")


def _base_archive(*, log: bool) -> Path:
    """The base's root file system as a tar from mmdebstrap (kept by its recipe)."""
    recipe = hashlib.sha256(repr((_BASE_PACKAGES, _BASE_EXCLUDES)).encode()).hexdigest()[:12]
    archive = cache_dir() / "images" / f"base-{recipe}.tar"
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    if log:
        print("making the base image from Debian packages (mmdebstrap, about a minute)")
    partial = archive.with_suffix(".partial")
    argv = [
        "mmdebstrap",
        "--variant=essential",
        "--mode=root",
        "--format=tar",
        f"--include={','.join(_BASE_PACKAGES)}",
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        *(f"--dpkgopt=path-exclude={pattern}" for pattern in _BASE_EXCLUDES),
        # apt's lists and caches are not part of an image.
        "--customize-hook=rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/*",
        "bookworm",
        str(partial),
    ]
    _run(argv, step="mmdebstrap (the base image)")
    partial.rename(archive)
    return archive


@contextlib.contextmanager
def _buildah_storage() -> Iterator[list[str]]:
    """buildah's argv prefix with storage of its own, removed on the way out."""
    leftovers = [path for path in _BUILDAH_LEFTOVERS if not path.exists()]
    storage = Path(tempfile.mkdtemp(prefix="buildah-", dir=cache_dir()))
    try:
        yield [
            "buildah",
            "--root",
            str(storage / "root"),
            "--runroot",
            str(storage / "run"),
            "--storage-driver",
            "vfs",
        ]
    finally:
        shutil.rmtree(storage, ignore_errors=True)
        for path in leftovers:
            shutil.rmtree(path, ignore_errors=True)


def _import_base(buildah: list[str], archive: Path, name: str) -> None:
    container = _run([*buildah, "from", "scratch"], step="buildah from scratch").strip()
    _run([*buildah, "add", container, str(archive), "/"], step="buildah add (the base)")
    _run(
        [
            *buildah,
            "config",
            "--env",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--cmd",
            "/bin/sh",
            "--label",
            "org.opencontainers.image.description=Debian bookworm (Python 3.11) made by "
            "mmdebstrap for gpushare's images",
            container,
        ],
        step="buildah config (the base)",
    )
    _run([*buildah, "commit", "--rm", container, name], step="buildah commit (the base)")


def _build(buildah: list[str], dockerfile: Path, base: str, name: str, archive: Path) -> None:
    mounts = [f"--volume={_HOST_CA}:{_HOST_CA}:ro"] if _HOST_CA.is_file() else []
    _run(
        [
            *buildah,
            "build",
            "--isolation=chroot",
            "--network=host",
            "--layers=false",
            *mounts,
            f"--build-arg=BASE={base}",
            f"--file={dockerfile}",
            f"--tag={name}",
            str(ROOT),
        ],
        step=f"buildah build {dockerfile.name}",
    )
    _run(
        [*buildah, "push", name, f"oci-archive:{archive}:{name}"],
        step=f"buildah push {name}",
    )


def _run(argv: list[str], *, step: str) -> str:
    env = {**os.environ, "BUILDAH_ISOLATION": "chroot"}
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise ImageBuildError(
            f"{step} failed (exit {done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
        )
    return done.stdout
