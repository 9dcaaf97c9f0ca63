"""What a failed Kubernetes call raises, read from its answer: `ApiError` (an error status,
with the Status's message and the apiserver's Retry-After) and `ApiUnreachable` (no answer at
all). No client library here, so the retry rules and the scheduling core may name them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gpushare.kube import protobuf


class ApiError(Exception):
    """A Kubernetes API call answered with an error status. `retry_after_s`: how long the
    apiserver asked to wait before trying again (its Retry-After header, or the Status's
    details.retryAfterSeconds), when it said."""

    def __init__(self, status: int, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s


def api_error(status: int, headers: Mapping[str, str], body: bytes) -> ApiError:
    """The ApiError of an answer: its status, the Status's message, and its Retry-After."""
    retry_after = _seconds(headers.get("Retry-After"))
    if retry_after is None:
        retry_after = _seconds(_status_detail(body, "retryAfterSeconds"))
    return ApiError(status, _status_message(body), retry_after_s=retry_after)


def _seconds(raw: object) -> float | None:
    """A Retry-After in seconds; None for anything else (an HTTP date is not sent by the
    apiserver)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw) if raw >= 0 else None
    if isinstance(raw, str) and raw.strip().isdigit():
        return float(raw.strip())
    return None


def _status_detail(body: bytes, key: str) -> object:
    try:
        decoded = json.loads(body)
    except ValueError:
        return None
    details = decoded.get("details") if isinstance(decoded, dict) else None
    return details.get(key) if isinstance(details, dict) else None


class ApiUnreachable(ConnectionError):
    """The apiserver did not answer a call: the connection failed or broke off (it is
    restarting, say). An OSError, as a refused connection is, so one `except OSError` covers
    every way a call can go unanswered; whether the call took effect is unknown."""


def _status_message(body: bytes) -> str:
    """The `message` of a Kubernetes Status body (JSON or protobuf), else the body as text."""
    try:
        return protobuf.field(body, 3)  # Status.message
    except ValueError:
        pass
    text = body.decode(errors="replace")
    try:
        decoded = json.loads(text)
    except ValueError:
        return text
    if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
        return str(decoded["message"])
    return text
