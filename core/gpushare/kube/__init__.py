"""Everything of gpushare that talks to the Kubernetes API (the pure rules are in
`gpushare.model`, which never imports this package).

- `client`: client set-up, raw JSON (and protobuf) responses with a checked status, `read_pod`.
- `errors`: what a failed call raises (`ApiError`, with the apiserver's Retry-After; no answer
  at all is `ApiUnreachable`, an OSError), free of any client library.
- `reflector`: list-then-watch, the one way gpushare reads a resource.
- `retry`: trying again, in one place: which errors are worth it (`transient`), the named
  policies (`WATCH`, `WRITE`, `READ`, `PUBLISH`, `REGISTER`, `bind_policy`), Retry-After
  honoured (`wait_s`), a call tried until it answers (`retry`), a wait that a stop event cuts
  short (`pause`).
- `protobuf`: the Binding and the Event, the two bodies sent for every pod bound, encoded as
  kube-scheduler sends them (cheaper for the apiserver to decode than JSON).
- `http2`: those two sent over HTTP/2, as kube-scheduler sends them (the operator's alone: its
  client library, pyreqwest, is the operator's dependency, not the CLI's or the plugin's).
- `clock`: the timestamps Kubernetes objects carry (RFC 3339, MicroTime), written and read.

The names callers use most are re-exported here: `from gpushare.kube import ApiError`.
"""

from gpushare.kube.client import (
    api_client,
    raw_json,
    read_pod,
)
from gpushare.kube.errors import ApiError, ApiUnreachable
from gpushare.kube.retry import transient

__all__ = [
    "ApiError",
    "ApiUnreachable",
    "api_client",
    "raw_json",
    "read_pod",
    "transient",
]
