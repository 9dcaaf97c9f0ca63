#!/usr/bin/env bash
# The GPU check (bench/gpu/check.py) on the lent GPU machine: PyTorch's venv there, and
# nvidia-ml-py and PyYAML from wheels carried in bench/gpu/wheels (no network there: make
# them here first with `bench/gpu/wheels.sh`). Under 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."
venv="${TMPDIR:-/tmp}/gpushare-gpu-check"
[ -x "$venv/bin/python" ] || /opt/torch/.venv/bin/python -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --no-index --find-links bench/gpu/wheels nvidia-ml-py PyYAML
exec "$venv/bin/python" bench/gpu/check.py --python "$venv/bin/python" "$@"
