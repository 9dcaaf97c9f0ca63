"""Kubernetes' protobuf encoding of the two bodies a scheduler writes for every pod it binds:
the Binding and the Scheduled Event.

The apiserver decodes a protobuf body several times faster than JSON, and kube-scheduler
sends both bodies this way; sent as JSON they were most of the extra apiserver CPU per pod
that the operator cost over kube-scheduler (docs/benchmarks.md). Two messages do not need a
protobuf library: the fields are written by hand, with their numbers from k8s.io/api's and
k8s.io/apimachinery's generated.proto. Everything else stays JSON.

A body is the magic `k8s\\0`, then a runtime.Unknown: {typeMeta {apiVersion, kind}, raw: the
object's message}. Answers come back in the same envelope; `field` reads a string out of one.
"""

from __future__ import annotations

from collections.abc import Mapping

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"
_VARINT = 0
_BYTES = 2


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _bytes(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | _BYTES) + _varint(len(value)) + value


def _text(number: int, value: str) -> bytes:
    return _bytes(number, value.encode()) if value else b""


def _integer(number: int, value: int) -> bytes:
    return _varint(number << 3 | _VARINT) + _varint(value)


def _envelope(kind: str, raw: bytes) -> bytes:
    type_meta = _text(1, "v1") + _text(2, kind)
    return _MAGIC + _bytes(1, type_meta) + _bytes(2, raw)


def _reference(*, kind: str, namespace: str, name: str, uid: str) -> bytes:
    """An ObjectReference of the core API group."""
    return _text(1, kind) + _text(2, namespace) + _text(3, name) + _text(4, uid) + _text(5, "v1")


def binding(
    *,
    namespace: str,
    name: str,
    uid: str,
    annotations: Mapping[str, str],
    node: str,
    labels: Mapping[str, str] | None = None,
) -> bytes:
    """A Binding of the pod `namespace/name` (only while it is `uid`) to `node`, carrying
    `annotations` onto the pod; `labels` are the Binding's own (from Kubernetes 1.35 the
    apiserver copies them to the pod as well)."""
    metadata = _text(1, name) + _text(3, namespace) + _text(5, uid)
    for key, value in sorted((labels or {}).items()):  # map<string, string> labels = 11
        metadata += _bytes(11, _text(1, key) + _text(2, value))
    for key, value in sorted(annotations.items()):  # map<string, string> annotations = 12
        metadata += _bytes(12, _text(1, key) + _text(2, value))
    target = _reference(kind="Node", namespace="", name=node, uid="")
    return _envelope("Binding", _bytes(1, metadata) + _bytes(2, target))


EVENTS_OF_CLUSTER_OBJECTS = "default"
"""Where Events about cluster-scoped objects (nodes) are kept, as the kubelet keeps its."""


def event(
    *,
    namespace: str,
    name: str,
    uid: str,
    event_type: str,
    reason: str,
    message: str,
    component: str,
    instance: str,
    at_s: int,
    kind: str = "Pod",
) -> bytes:
    """A core/v1 Event about the `kind` (core API group) `namespace/name` (`uid`; namespace ""
    for a cluster-scoped object), first and last seen at `at_s` (Unix seconds), named by the
    apiserver from the object's name."""
    metadata = _text(2, f"{name}.") + _text(3, namespace or EVENTS_OF_CLUSTER_OBJECTS)
    stamp = _integer(1, at_s)
    body = (
        _bytes(1, metadata)
        + _bytes(2, _reference(kind=kind, namespace=namespace, name=name, uid=uid))
        + _text(3, reason)
        + _text(4, message)
        + _bytes(5, _text(1, component))
        + _bytes(6, stamp)
        + _bytes(7, stamp)
        + _integer(8, 1)
        + _text(9, event_type)
        + _text(14, component)
        + _text(15, instance)
    )
    return _envelope("Event", body)


def field(body: bytes, *path: int) -> str:
    """The string at the message field numbers `path` of the object in an answer's envelope
    (the object's name is `field(body, 1, 1)`: metadata, name); "" when it is absent."""
    if not body.startswith(_MAGIC):
        raise ValueError("not a Kubernetes protobuf body")
    message = _first(memoryview(body)[len(_MAGIC) :], 2)  # Unknown.raw
    for number in path:
        message = _first(message, number)
    return bytes(message).decode()


def _first(message: memoryview, wanted: int) -> memoryview:
    """The first length-delimited field `wanted` of `message`; empty when it has none."""
    at = 0
    while at < len(message):
        key, at = _read_varint(message, at)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, at = _read_varint(message, at)
        elif wire == _BYTES:
            length, at = _read_varint(message, at)
            if at + length > len(message):
                raise ValueError("protobuf body cut short")
            if number == wanted:
                return message[at : at + length]
            at += length
        elif wire == 1:  # fixed64
            at += 8
        elif wire == 5:  # fixed32
            at += 4
        else:
            raise ValueError(f"protobuf wire type {wire} not expected in a Kubernetes object")
    return message[0:0]


def _read_varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("protobuf body cut short")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
