"""The one error the CLI reports to people: a message and the exit status that goes with it."""

from __future__ import annotations


class CliError(Exception):
    """What went wrong, for stderr; `status` 1 when the cluster or the pod could not be read,
    2 for bad arguments or a bad file."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status
