#!/usr/bin/env bash
# The wheels the GPU check needs on a machine with no network (pure Python, any platform),
# downloaded here into bench/gpu/wheels (ignored by git; the device tool carries them).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --dest wheels "nvidia-ml-py==13.615.71" "PyYAML==6.0.3" --platform manylinux2014_x86_64
