"""What each install pulls in: `pip install gpushare` is the CLI alone, the images take one
component's extra each, and the harness and the test tools are never shipped."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[=<>\[ ;]", requirement, maxsplit=1)[0] for requirement in requirements}


def test_the_cli_alone_pulls_no_kopf_grpc_or_nvml() -> None:
    base = names(PROJECT["dependencies"])
    assert not base & {"kopf", "grpcio", "grpcio-tools", "protobuf", "nvidia-ml-py"}


def test_each_component_extra_carries_only_its_own_dependencies() -> None:
    extras = {extra: names(reqs) for extra, reqs in PROJECT["optional-dependencies"].items()}
    assert "kopf" in extras["operator"]
    assert not extras["operator"] & {"grpcio", "grpcio-tools", "nvidia-ml-py"}
    assert {"grpcio", "nvidia-ml-py"} <= extras["plugin"]
    assert not extras["plugin"] & {"kopf", "grpcio-tools"}
    shipped = extras["operator"] | extras["plugin"] | names(PROJECT["dependencies"])
    assert not shipped & {"grpcio-tools", "pytest", "hypothesis", "mypy"}
    # The operator makes its admission webhook's certificate; the plugin needs no crypto.
    assert "cryptography" in extras["operator"] - extras["plugin"]


def test_the_harness_is_not_part_of_the_shipped_distribution() -> None:
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "harness" not in found["packages"]["find"]["where"]
    assert "gpushare-dev" not in PROJECT["scripts"]


def test_the_cli_imports_without_kopf_or_grpc() -> None:
    # Both are installed here: make them unimportable, as in an install of the CLI alone.
    blocked = "import sys; sys.modules.update(kopf=None, grpc=None, pynvml=None)"
    result = subprocess.run(
        [sys.executable, "-c", f"{blocked}; import gpushare_cli.main"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
