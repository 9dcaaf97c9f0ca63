"""Reading raw Kubernetes objects safely.

Bodies arrive as plain JSON dicts (watch events, raw API responses, YAML files) and are
untrusted: any field may be missing or of the wrong type. These helpers make "missing" and
"mistyped" read the same, so the rest of the model never indexes a raw dict. `Any` stays
inside this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

Body: TypeAlias = Mapping[str, Any]
"""A raw Kubernetes object (or part of one) as parsed from JSON or YAML."""

_EMPTY: Body = {}


def mapping(value: object) -> Body:
    """`value` if it is a JSON object, else an empty one."""
    if isinstance(value, dict):  # the common case, and much cheaper than the ABC check
        return value
    return value if isinstance(value, Mapping) else _EMPTY


def sequence(value: object) -> list[Body]:
    """The JSON objects in `value` if it is an array (other items dropped), else []."""
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, Mapping)]


def text(value: object) -> str | None:
    """`value` if it is a string, else None."""
    return value if isinstance(value, str) else None


def path(body: Body, *keys: str) -> Body:
    """The object at `keys` under `body` (empty if any step is missing or not an object)."""
    for key in keys:
        body = mapping(body.get(key))
    return body


def annotations_of(body: Body) -> Mapping[str, str]:
    """metadata.annotations with non-string values left out."""
    return _strings(path(body, "metadata", "annotations"))


def labels_of(body: Body) -> Mapping[str, str]:
    """metadata.labels with non-string values left out."""
    return _strings(path(body, "metadata", "labels"))


def _strings(raw: Body) -> Mapping[str, str]:
    return {key: value for key, value in raw.items() if isinstance(value, str)}


def resource_version(body: Body) -> int | None:
    """metadata.resourceVersion as a number, to order two states of one object; None where
    it is missing or opaque (the API only promises an opaque string, though etcd gives
    numbers)."""
    raw = text(path(body, "metadata").get("resourceVersion")) or ""
    return int(raw) if raw.isdigit() else None


def describe(body: Body, kind: str) -> str:
    """How messages name an object: ``pod default/gpu-pod1``, ``node gpu-node-1``."""
    meta = path(body, "metadata")
    generated = text(meta.get("generateName"))
    name = text(meta.get("name")) or (f"{generated}<generated>" if generated else "<unnamed>")
    namespace = text(meta.get("namespace"))
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"
