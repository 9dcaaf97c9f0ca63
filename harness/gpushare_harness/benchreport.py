"""How the apiserver benchmarks end: their results as a table, and as JSON where asked."""

from __future__ import annotations

import argparse
import json
import os
import platform
from collections.abc import Mapping
from typing import Any


def report(
    heading: str, results: Mapping[str, Mapping[str, Any]], args: argparse.Namespace
) -> None:
    """Print `heading` with the machine, then each result's figures (its rounds left out);
    write them all to `args.json` when it is set."""
    machine = (
        f"{platform.machine()}, {platform.python_version()}, {os.cpu_count()} cores shared by all"
    )
    print(f"{heading}; {machine}")
    width = max(map(len, results), default=0)
    for label, found in results.items():
        shown = {k: v for k, v in found.items() if k != "rounds"}
        print(f"  {label:<{width}} {shown}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": machine, "args": vars(args), "results": results}, indent=2, default=str
            )
        )
