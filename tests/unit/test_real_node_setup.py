"""What a person meets before a real node starts: the packages it lacks named with the fix,
and the images it imports readable as OCI archives whose digests hold."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from gpushare_harness import images, realnode
from gpushare_harness.binaries import Binaries


def test_a_missing_runtime_package_is_named_with_the_command_that_installs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    present = shutil.which
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(
        shutil,
        "which",
        lambda tool: None if tool in ("runc", "nsenter") else present(tool),
    )
    with pytest.raises(realnode.RealNodeError) as refused:
        realnode.check_prerequisites()
    message = str(refused.value)
    assert "util-linux" in message
    assert "runc" in message
    assert "make node-packages" in message


def test_a_real_node_refuses_to_start_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(realnode.RealNodeError, match="needs root"):
        realnode.check_prerequisites()


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {
            m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
            for m in tar.getmembers()
            if m.isfile()
        }


@pytest.mark.skipif(not images.BUSYBOX.is_file(), reason="busybox-static is not installed")
def test_the_guides_image_stand_in_is_an_oci_archive_that_says_what_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUSHARE_CACHE", str(tmp_path))
    pause = tmp_path / "pause"
    pause.write_bytes(b"\x7fELF not really")
    binaries = Binaries(**dict.fromkeys(Binaries.__dataclass_fields__, pause))
    made = {image.name: image.archive for image in images.node_images(binaries)}
    assert set(made) == {images.PAUSE_IMAGE, images.CUDA_STANDIN_IMAGE}
    blobs = _members(made[images.CUDA_STANDIN_IMAGE])
    for name, data in blobs.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(blobs["index.json"])
    descriptor = index["manifests"][0]
    assert (
        descriptor["annotations"]["io.containerd.image.name"] == "docker.io/nvidia/cuda:9.0-devel"
    )
    manifest = json.loads(blobs[f"blobs/sha256/{descriptor['digest'].split(':')[1]}"])
    config = json.loads(blobs[f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"])
    assert "no CUDA" in config["config"]["Labels"]["org.opencontainers.image.description"]
    layer = blobs[f"blobs/sha256/{manifest['layers'][0]['digest'].split(':')[1]}"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        names = set(tar.getnames())
        readme = tar.extractfile("README").read().decode()  # type: ignore[union-attr]
    assert {"bin/busybox", "bin/sh", "bin/env", "bin/sleep"} <= names
    assert "not nvidia/cuda:9.0-devel" in readme
    # Built once: the same inputs give the same archive from the cache.
    again = {image.name: image.archive for image in images.node_images(binaries)}
    assert again == made
