"""The `gpushare` CLI run in-process against a kubeconfig, as a user runs it."""

from __future__ import annotations

import pytest

from gpushare_cli.kubeconfig import Source
from gpushare_cli.main import main


def gpushare(
    capsys: pytest.CaptureFixture[str], source: Source, *args: str
) -> tuple[int, str, str]:
    """Its exit status, what it printed and what it said on stderr."""
    status = main(["--kubeconfig", str(source.files[0]), *args])
    shown = capsys.readouterr()
    return status, shown.out, shown.err
