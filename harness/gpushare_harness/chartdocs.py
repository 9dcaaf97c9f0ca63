"""The values table of the Helm chart's README (charts/gpushare/README.md), generated from
values.yaml: each key's default, its type from values.schema.json, and its description, the
comment written just above it in values.yaml.

A key with a comment is one row (a mapping with a comment, such as `resources`, is one row
too); a key without one is a section, and each of its keys needs a comment of its own. The
generator refuses a value without a description and a value the schema does not know, so the
table, the values and the schema cannot drift apart (tests/unit/test_chart.py checks the
committed table is what this writes).

    python -m gpushare_harness.chartdocs            # rewrite the README's table
    python -m gpushare_harness.chartdocs --check    # exit 1 when it is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "gpushare"
BEGIN = (
    "<!-- values table: generated from values.yaml by `python -m gpushare_harness.chartdocs` -->"
)
END = "<!-- end of the values table -->"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?:\s|$)")
_COMMENT = re.compile(r"^\s*#\s?(?P<text>.*)$")


class ChartDocsError(Exception):
    """values.yaml and values.schema.json disagree, or a value has no description."""


@dataclass(frozen=True, kw_only=True)
class Row:
    key: str
    kind: str
    default: str
    description: str


def comments(values_text: str) -> dict[str, str]:
    """Each key's dotted path and the comment lines just above it (joined), for the keys of
    block mappings (keys inside flow values and lists are not paths)."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in values_text.splitlines():
        comment = _COMMENT.match(line)
        if comment:
            pending.append(comment["text"].strip())
            continue
        if not line.strip():
            pending = []
            continue
        key = _KEY.match(line)
        if key:
            indent = len(key["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, key["key"]))
            path = ".".join(name for _, name in stack)
            if pending:
                found[path] = " ".join(pending)
        pending = []
    return found


def _resolve(schema: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str):
        target: Mapping[str, Any] = schema
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        return target
    return node


def _kind(node: Mapping[str, Any]) -> str:
    kind = node.get("type", "")
    shown = " or ".join(kind) if isinstance(kind, list) else str(kind)
    if "enum" in node:
        shown += ": " + ", ".join(f"`{value}`" for value in node["enum"])
    return shown


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def rows(values_text: str, schema: Mapping[str, Any]) -> Iterator[Row]:
    """A row per documented key, in values.yaml's order; ChartDocsError for a value without a
    description or unknown to the schema, and for a schema key values.yaml leaves out."""
    values = yaml.safe_load(values_text)
    described = comments(values_text)
    problems: list[str] = []

    def walk(value: Any, node: Mapping[str, Any], path: str) -> Iterator[Row]:
        node = _resolve(schema, node)
        if path in described:
            default = json.dumps(value, separators=(", ", ": "))
            yield Row(key=path, kind=_kind(node), default=default, description=described[path])
            return
        properties = node.get("properties")
        if not isinstance(value, dict) or not isinstance(properties, dict):
            problems.append(f"{path or 'the values'}: no comment above it in values.yaml")
            return
        for key, child in value.items():
            where = f"{path}.{key}" if path else key
            if key not in properties:
                problems.append(f"{where}: not in values.schema.json")
                continue
            yield from walk(child, properties[key], where)
        problems.extend(
            f"{path}.{key}: in values.schema.json, not in values.yaml"
            if path
            else f"{key}: in values.schema.json, not in values.yaml"
            for key in properties
            if key not in value
        )

    found = list(walk(values, schema, ""))
    if problems:
        raise ChartDocsError("; ".join(problems))
    yield from found


def table(values_text: str, schema: Mapping[str, Any]) -> str:
    lines = ["| key | type | default | description |", "| --- | --- | --- | --- |"]
    lines += [
        f"| `{row.key}` | {_cell(row.kind)} | `{_cell(row.default)}` | {_cell(row.description)} |"
        for row in rows(values_text, schema)
    ]
    return "\n".join(lines)


def rendered(readme: str, chart: Path = CHART) -> str:
    """`readme` with the table between its markers written from `chart`'s values."""
    if BEGIN not in readme or END not in readme:
        raise ChartDocsError(f"the README has no values table markers ({BEGIN} ... {END})")
    schema = json.loads((chart / "values.schema.json").read_text())
    fresh = table((chart / "values.yaml").read_text(), schema)
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{fresh}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpushare_harness.chartdocs", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    args = parser.parse_args(argv)
    path = CHART / "README.md"
    current = path.read_text()
    try:
        fresh = rendered(current)
    except ChartDocsError as error:
        print(f"chartdocs: {error}", file=sys.stderr)
        return 2
    if fresh == current:
        return 0
    if args.check:
        print(f"{path} is stale: run python -m gpushare_harness.chartdocs", file=sys.stderr)
        return 1
    path.write_text(fresh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
