"""The one error the CLI reports to people: a message and the exit status that goes with it."""

from __future__ import annotations

import yaml


class CliError(Exception):
    """What went wrong, for stderr; `status` 1 when the cluster or the pod could not be read,
    2 for bad arguments, a bad file or a bad GPUSHARE_* value."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def yaml_problem(error: yaml.YAMLError) -> str:
    """What is wrong in a YAML text and where, on one line (PyYAML's own message spans
    several, with the text quoted)."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{error.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(error).split())
