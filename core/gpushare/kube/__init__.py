"""Everything of gpushare that talks to the Kubernetes API (the pure rules are in
`gpushare.model`, which never imports this package).

- `client`: client set-up, raw JSON (and protobuf) responses with a checked status
  (`ApiError`; no answer at all is `ApiUnreachable`, an OSError; `transient` tells the errors
  worth a retry), `read_pod`.
- `reflector`: list-then-watch, the one way gpushare reads a resource.
- `retry`: trying again, written once: the delays (`Backoff`), a call tried until it answers
  (`retry`), a wait that a stop event cuts short (`pause`).
- `protobuf`: the Binding and the Event, the two bodies sent for every pod bound, encoded as
  kube-scheduler sends them (cheaper for the apiserver to decode than JSON).
- `clock`: the timestamps Kubernetes objects carry (RFC 3339, MicroTime), written and read.

The names callers use most are re-exported here: `from gpushare.kube import ApiError`.
"""

from gpushare.kube.client import (
    ApiError,
    ApiUnreachable,
    api_client,
    post_protobuf,
    raw_json,
    read_pod,
    transient,
)

__all__ = [
    "ApiError",
    "ApiUnreachable",
    "api_client",
    "post_protobuf",
    "raw_json",
    "read_pod",
    "transient",
]
