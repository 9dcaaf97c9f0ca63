"""The protobuf bodies read back field by field, and answers that are not protobuf refused.
(That the apiserver takes them as the operator's Binding and Event, with every field, is
tested against a real one: tests/integration/test_guide_binding.py.)"""

from __future__ import annotations

import pytest

from gpushare.kube import protobuf

BINDING = protobuf.binding(
    namespace="team-a",
    name="gpu-pod1",
    uid="6b1d1e4c-0000-4000-8000-000000000001",
    annotations={"volcano.sh/gpu-index": "3", "volcano.sh/predicate-time": "1"},
    node="gpu-node-1",
)


def test_a_binding_names_the_pod_its_uid_and_the_node() -> None:
    assert BINDING.startswith(b"k8s\x00")
    assert protobuf.field(BINDING, 1, 1) == "gpu-pod1"  # metadata.name
    assert protobuf.field(BINDING, 1, 3) == "team-a"  # metadata.namespace
    assert protobuf.field(BINDING, 1, 5) == "6b1d1e4c-0000-4000-8000-000000000001"  # uid
    assert protobuf.field(BINDING, 2, 1) == "Node"  # target.kind
    assert protobuf.field(BINDING, 2, 3) == "gpu-node-1"  # target.name


def test_an_event_is_named_after_its_pod_by_the_apiserver() -> None:
    body = protobuf.event(
        namespace="team-a",
        name="gpu-pod1",
        uid="u",
        event_type="Normal",
        reason="Scheduled",
        message="Successfully assigned team-a/gpu-pod1 to gpu-node-1",
        component="gpushare-scheduler",
        instance="gpushare-0",
        at_s=1_790_000_000,
    )
    assert protobuf.field(body, 1, 1) == ""  # no name: the apiserver generates it
    assert protobuf.field(body, 1, 2) == "gpu-pod1."  # metadata.generateName
    assert protobuf.field(body, 2, 4) == "u"  # involvedObject.uid
    assert protobuf.field(body, 4) == "Successfully assigned team-a/gpu-pod1 to gpu-node-1"
    assert protobuf.field(body, 15) == "gpushare-0"  # reportingInstance


def test_long_strings_keep_every_byte() -> None:
    message = "é" * 300  # a length over one varint byte, in multi-byte characters
    body = protobuf.event(
        namespace="n",
        name="p",
        uid="u",
        event_type="Warning",
        reason="FailedScheduling",
        message=message,
        component="c",
        instance="i",
        at_s=0,
    )
    assert protobuf.field(body, 4) == message


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        (b'{"kind":"Status","message":"no"}', "not a Kubernetes protobuf body"),
        (b"k8s\x00\x12\x05ab", "cut short"),
        (b"k8s\x00\x0f", "wire type 7"),
    ],
)
def test_an_answer_that_is_not_a_whole_protobuf_object_is_refused(
    answer: bytes, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        protobuf.field(answer, 1, 1)
