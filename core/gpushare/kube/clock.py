"""The timestamps Kubernetes objects carry, written and read once.

Kubernetes has two forms, both RFC 3339 in UTC: `metav1.Time` to the second (events'
first/lastTimestamp, conditions' lastTransitionTime, our status fields) and `metav1.MicroTime`
to the microsecond (a Lease's acquireTime and renewTime).
"""

from __future__ import annotations

import datetime

_SECONDS = "%Y-%m-%dT%H:%M:%SZ"
_MICROSECONDS = "%Y-%m-%dT%H:%M:%S.%fZ"


def _moment(at: float | None) -> datetime.datetime:
    if at is None:
        return datetime.datetime.now(datetime.UTC)
    return datetime.datetime.fromtimestamp(at, datetime.UTC)


def rfc3339(at: float | None = None) -> str:
    """`at` (unix seconds; now when None) as a `metav1.Time`: ``2006-01-02T15:04:05Z``."""
    return _moment(at).strftime(_SECONDS)


def micro_time(at: float | None = None) -> str:
    """`at` (unix seconds; now when None) as a `metav1.MicroTime`:
    ``2006-01-02T15:04:05.000000Z``."""
    return _moment(at).strftime(_MICROSECONDS)


def parse_time(raw: object) -> float | None:
    """Unix seconds of a Kubernetes timestamp (either form; Python's ISO 8601 reading);
    None when `raw` is not one."""
    if not isinstance(raw, str):
        return None
    try:
        return datetime.datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
