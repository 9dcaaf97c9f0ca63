"""The two images the local real node needs, written as OCI archives without a registry or
an engine, and imported into the node's containerd.

- `localhost/gpushare/pause:1`: the pod sandbox, our own `pause` (harness/go/pause).
- `docker.io/nvidia/cuda:9.0-devel`: the name the guide's pods ask for, which cannot be
  pulled here. What it really holds is Debian's busybox-static (sh, env, sleep, ...) and
  nothing of CUDA; its labels say so, and so does `kubectl exec ... cat /README`.

An archive is rebuilt only when what goes into it changes (cached by content hash).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

from gpushare_harness.binaries import Binaries, cache_dir

BUSYBOX = Path("/bin/busybox")
PAUSE_IMAGE = "localhost/gpushare/pause:1"
CUDA_STANDIN_IMAGE = "docker.io/nvidia/cuda:9.0-devel"
_STANDIN_README = (
    "This is not nvidia/cuda:9.0-devel. It is gpushare's local stand-in under that name: "
    "Debian's busybox-static and nothing else (no CUDA, no driver). The guide's pods ask "
    "for the image by this name, and no registry can be reached on this machine.\n"
)
# The applets a test or a person uses in the stand-in (kubectl exec ... env, sh, cat).
_APPLETS = ("sh", "env", "sleep", "cat", "ls", "ps", "echo", "true", "false", "id", "wc")


class ImageError(RuntimeError):
    """An image cannot be made; the message names the package to install."""


@dataclass(frozen=True)
class Image:
    name: str
    archive: Path


def node_images(binaries: Binaries) -> list[Image]:
    """The pause image and the guide's image stand-in, as OCI archives in the cache."""
    if not BUSYBOX.is_file():
        raise ImageError(
            f"{BUSYBOX} is missing: the stand-in for {CUDA_STANDIN_IMAGE} is made from it "
            "(apt-get install busybox-static, or `make node-packages`)"
        )
    busybox = BUSYBOX.read_bytes()
    standin: dict[str, tuple[bytes, int] | str] = {
        "bin/busybox": (busybox, 0o755),
        "README": (_STANDIN_README.encode(), 0o644),
        "tmp/": "dir",
    }
    for applet in _APPLETS:
        standin[f"bin/{applet}"] = "busybox"
    return [
        _archive(
            PAUSE_IMAGE,
            {"pause": (binaries.pause.read_bytes(), 0o755)},
            {"Entrypoint": ["/pause"]},
            "gpushare's pause (harness/go/pause), the local node's pod sandbox",
        ),
        _archive(
            CUDA_STANDIN_IMAGE,
            standin,
            {"Env": ["PATH=/bin"], "Cmd": ["sh"]},
            _STANDIN_README.strip(),
        ),
    ]


def _archive(
    name: str, files: dict[str, tuple[bytes, int] | str], config: dict[str, object], about: str
) -> Image:
    layer = _layer(files)
    digest = hashlib.sha256(layer + json.dumps([name, config, about]).encode()).hexdigest()
    path = cache_dir() / "images" / f"{name.replace('/', '_').replace(':', '_')}-{digest[:12]}.tar"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_bytes(_oci_archive(name, layer, config, about))
        partial.rename(path)
    return Image(name, path)


def _layer(files: dict[str, tuple[bytes, int] | str]) -> bytes:
    """An uncompressed tar of `files`: (content, mode), "dir", or a symlink target."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for folder in sorted({f"{p.rsplit('/', 1)[0]}/" for p in files if "/" in p}):
            tar.addfile(_entry(folder, tarfile.DIRTYPE, 0o755))
        for path, what in sorted(files.items()):
            if what == "dir":
                continue
            if isinstance(what, str):
                entry = _entry(path, tarfile.SYMTYPE, 0o777)
                entry.linkname = what
                tar.addfile(entry)
            else:
                content, mode = what
                entry = _entry(path, tarfile.REGTYPE, mode)
                entry.size = len(content)
                tar.addfile(entry, io.BytesIO(content))
    return out.getvalue()


def _entry(path: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    entry = tarfile.TarInfo(path.rstrip("/") if kind != tarfile.DIRTYPE else path)
    entry.type = kind
    entry.mode = 0o1777 if path == "tmp/" else mode
    entry.mtime = 0
    return entry


def _oci_archive(name: str, layer: bytes, config: dict[str, object], about: str) -> bytes:
    """An OCI image layout (oci-layout, index.json, blobs) in one tar, as `ctr images
    import` reads it."""
    blobs: dict[str, bytes] = {}

    def blob(data: bytes, media_type: str) -> dict[str, object]:
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    compressed = gzip.compress(layer, mtime=0)
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {**config, "Labels": {"org.opencontainers.image.description": about}},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
        "history": [{"created_by": "gpushare_harness.images", "comment": about}],
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(
            json.dumps(image_config).encode(), "application/vnd.oci.image.config.v1+json"
        ),
        "layers": [blob(compressed, "application/vnd.oci.image.layer.v1.tar+gzip")],
    }
    manifest_descriptor = blob(
        json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json"
    )
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                **manifest_descriptor,
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                },
            }
        ],
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        entries = {
            "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
            "index.json": json.dumps(index).encode(),
            **{f"blobs/sha256/{d.split(':')[1]}": data for d, data in blobs.items()},
        }
        for path, data in entries.items():
            entry = _entry(path, tarfile.REGTYPE, 0o644)
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
    return out.getvalue()
