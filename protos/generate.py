"""Generate the Python stubs of the vendored kubelet APIs (device plugin, pod resources).

The stubs are committed (device_plugin/gpushare_plugin/_proto/) so that an installed wheel
needs no compiler; tests/unit/plugin/test_protos.py regenerates them into a temporary folder
and fails when the committed copies are stale. Run: `python protos/generate.py`.

The include path maps protos/ to the package path, so the generated gRPC module imports
`gpushare_plugin._proto.v1beta1.api_pb2`; the proto's own `package v1beta1` (and so every
gRPC method name, e.g. /v1beta1.Registration/Register) is untouched.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc  # type: ignore[import-untyped]  # no stubs upstream

PROTOS = Path(__file__).resolve().parent
DEFAULT_OUT = PROTOS.parent / "device_plugin"
PACKAGE_PATH = "gpushare_plugin/_proto"
GENERATED = ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py")
APIS = ("v1beta1", "podresources_v1")
"""Folders under protos/, each with one vendored `api.proto`."""


def generate(out: Path) -> list[Path]:
    """Write the stubs under `out`/gpushare_plugin/_proto/<api>; returns their paths."""
    written = []
    for api in APIS:
        target = out / PACKAGE_PATH / api
        target.mkdir(parents=True, exist_ok=True)
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PACKAGE_PATH}={PROTOS}",
                f"--python_out={out}",
                f"--pyi_out={out}",
                f"--grpc_python_out={out}",
                f"{PACKAGE_PATH}/{api}/api.proto",
            ]
        )
        if status != 0:
            raise SystemExit(f"protoc failed on {api} with status {status}")
        written += [target / name for name in GENERATED]
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="source root to write")
    for written in generate(parser.parse_args().out):
        print(written, file=sys.stderr)


if __name__ == "__main__":
    main()
