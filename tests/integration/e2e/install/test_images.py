"""The images' bad input: a base image without Python stops the build with the reason, not a
container that crashes later."""

from __future__ import annotations

import os

import pytest

from gpushare_harness.binaries import ensure_binaries
from gpushare_harness.imagebuild import ImageBuildError, build_images
from gpushare_harness.images import CUDA_STANDIN_IMAGE, node_images

pytestmark = [pytest.mark.integration]


def test_a_base_without_python_stops_the_build_naming_what_it_needs() -> None:
    if os.geteuid() != 0:
        pytest.skip("buildah's chroot isolation needs root")
    # The guide's image stand-in: busybox's sh and nothing of Python.
    standin = next(i for i in node_images(ensure_binaries()) if i.name == CUDA_STANDIN_IMAGE)
    with pytest.raises(ImageBuildError, match=r"the BASE image needs python3 >= 3\.11"):
        build_images(base=standin.archive, log=False)
