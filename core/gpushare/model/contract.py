"""Every exact string shared with Volcano's GPU Sharing and with our own resources.

These names are the wire contract: a workload written for Volcano must run unchanged, so none
of them may change. See docs/contract.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

# Extended resources, read from container limits only.
GPU_MEMORY: Final = "volcano.sh/gpu-memory"
GPU_NUMBER: Final = "volcano.sh/gpu-number"

# Pod annotations.
GPU_INDEX: Final = "volcano.sh/gpu-index"
"""Card(s) the scheduler chose: ``"3"``, or ``"0,5"`` for several whole cards."""
PREDICATE_TIME: Final = "volcano.sh/predicate-time"
"""Decimal unix nanoseconds of the scheduling decision; orders Allocate candidates."""
GPU_ASSIGNED: Final = "volcano.sh/gpu-assigned"
"""``"true"`` once the kubelet has started the pod with its grant (the device plugin, seeing
it admitted, writes it)."""
GPU_ASSIGNED_TRUE: Final = "true"
GPU_ASSIGNED_FALSE: Final = "false"
"""Written with every Binding: a value forged on the pending pod never counts as served."""

# Node annotation: comma list of card indices that must not be used.
GPU_UNHEALTHY_IDS: Final = "volcano.sh/gpu-unhealthy-ids"

# Container environment set by the device plugin's Allocate.
ENV_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_GPU_ALLOCATED: Final = "VOLCANO_GPU_ALLOCATED"
ENV_GPU_MEMORY_TOTAL: Final = "VOLCANO_GPU_MEMORY_TOTAL"

# The frameworks' own limits, given with a share of a card (gpushare's, not Volcano's).
ENV_PYTORCH_ALLOC_CONF: Final = "PYTORCH_CUDA_ALLOC_CONF"
ENV_JAX_MEM_FRACTION: Final = "XLA_PYTHON_CLIENT_MEM_FRACTION"
ENV_TF_ALLOW_GROWTH: Final = "TF_FORCE_GPU_ALLOW_GROWTH"
ENV_MPS_MEM_LIMIT: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
FRAMEWORK_LIMITS: Final = "gpushare.io/framework-limits"
"""Pod annotation: the frameworks whose limits its containers get (a comma list of `pytorch`,
`jax`, `tensorflow`; `off`: none), instead of the node's (`gpushare.model.limits`)."""

DEFAULT_SCHEDULER_NAME: Final = "volcano"

# The memory unit: MiB per volcano.sh/gpu-memory device. Users write MiB; the admission
# webhook turns a pod's limits into whole units at creation and keeps what was asked here.
DEFAULT_MEMORY_UNIT_MIB: Final = 512
"""Coarse enough that a pod's device ids (the kubelet writes each into its status) stay few,
fine enough that rounding a card down to whole units loses under 5% of an 11 GiB card."""
MEMORY_UNIT_MIB: Final = "gpushare.io/memory-unit-mib"
"""Pod annotation: the MiB per device its gpu-memory limits were converted to, ``"512"``."""
GPU_MEMORY_MIB: Final = "gpushare.io/gpu-memory-mib"
"""Pod annotation: the MiB each container asked, ``"cuda-container=1024,sidecar=512"``."""
GPU_POD_LABEL: Final = "gpushare.io/gpu-pod"
"""Pod label the admission webhook puts on every GPU pod at creation (`GPU_POD_LABEL_VALUE`):
the apiserver's placement policy judges the writes of the pods that carry it and of no other
pod, so a pod without GPUs costs no policy evaluation; the policy keeps it from being removed
or changed."""
GPU_POD_LABEL_VALUE: Final = "true"
GPU_POD_LABELS: Final[Mapping[str, str]] = MappingProxyType({GPU_POD_LABEL: GPU_POD_LABEL_VALUE})
"""What the webhook adds, and the operator to a GPU pod made before that (or while gpushare
was not installed)."""

# Our inventory custom resource: cluster-scoped, one per GPU node, named after the node.
# Its spec is written by the device plugin, its status by the operator.
INVENTORY_GROUP: Final = "gpushare.io"
INVENTORY_VERSION: Final = "v1alpha1"
INVENTORY_PLURAL: Final = "gpunodes"
INVENTORY_KIND: Final = "GPUNode"

MEASURED_USAGE: Final = "gpushare.io/measured-usage"
"""GPUNode annotation the device plugin keeps: what each container holds on each card, as
NVML measures its processes (JSON, `usage.MeasuredUsage`); the operator acts on it."""
PLUGIN_HEARTBEAT: Final = "gpushare.io/plugin-heartbeat"
"""GPUNode annotation: when the node's device plugin last said it runs (RFC 3339), renewed
every `--heartbeat-seconds`; the operator turns it into the `Ready` and `Stale` conditions."""

# Our live configuration custom resource: cluster-scoped; the operator reads only the one
# named LIVE_CONFIG_NAME and writes its status, the CLI reads it to decide as the operator does.
CONFIG_GROUP: Final = INVENTORY_GROUP
CONFIG_VERSION: Final = INVENTORY_VERSION
CONFIG_PLURAL: Final = "gpushareconfigs"
CONFIG_KIND: Final = "GPUShareConfig"
LIVE_CONFIG_NAME: Final = "default"
EFFECTIVE_CONFIG: Final = "gpushare.io/effective-config"
"""Annotation the leading operator keeps on its Lease: the configuration it decides with (its
environment and the live GPUShareConfig, as a GPUShareConfig spec in JSON), for the CLI."""
GANG_MIN_MEMBER: Final = "gpushare.io/gang-min-member"
"""On a Binding (and so on the pod it binds) of a pod that names a PodGroup: the gang's
`minMember` then (1 where no PodGroup of that name made it a gang). Preemption holds a gang to
what its members were bound under, not to a `minMember` its tenant raised afterwards, which
would tie pods bound one by one, or a smaller gang, into one that costs more to preempt."""
LEADER_TERM: Final = "gpushare.io/leader-term"
"""On a Binding (and so on the pod it binds) and on an eviction: the Lease term it was sent in,
`<lease namespace>/<lease name>/<holder>/<leaseTransitions>`, for people and logs; the
apiserver judges the two labels below."""
LEASE_LABEL: Final = "gpushare.io/lease"
"""Label on the same writes: the Lease whose leader sent them, `<namespace>.<name>`. The
ValidatingAdmissionPolicyBinding FENCE_BINDING selects its Lease's writes by it."""
LEASE_TERM_LABEL: Final = "gpushare.io/lease-term"
"""Label on the same writes: the term they were sent in, `<leaseTransitions>.<Lease uid>` (a
new holder counts one more; a Lease made anew has a new uid). The leader sets its term on
FENCE_BINDING as it starts to lead, and the binding sends every write of its Lease in another
term to a policy that refuses it: a label selector, so the writes of the term now cost the
apiserver no policy evaluation."""
FENCE_BINDING: Final = "gpushare-leader-writes"
"""The ValidatingAdmissionPolicyBinding (of the policy of that name) whose object selector
holds the Lease's term now, which the leader sets (a JSON Patch of that one value)."""
TERM_OVER: Final = "was sent in a Lease term that is over"
"""What the policy gpushare-leader-writes says when it refuses a write, as the operator knows
the refusal (a test holds the manifests to it)."""

# Card health, spelled as the kubelet device-plugin API spells device health.
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
