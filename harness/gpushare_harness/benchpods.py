"""The pods the scheduling benchmarks create, in one of two shapes:

- `minimal`: one container with a GPU limit and nothing else, the smallest pod there is
  (under 1 KiB in etcd: there, a hundred bytes more is a tenth more);
- `workload`: a pod as a Job's controller creates it and the apiserver's admission completes
  it (the Job's labels and owner, a projected service-account token volume, the two default
  NoExecute tolerations, a command, env, a data volume): about 3 KiB in etcd, the size of the
  pods clusters run.

Neither asks for CPU or memory: the fake nodes only have GPUs to fit. A GPU pod carries the
label the admission webhook gives every GPU pod (the benchmarks install no webhook; the
operator would otherwise add it with the Binding, which kube-scheduler's do not carry).
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from gpushare.model import contract
from gpushare.model.admission import asks_for_gpus

SHAPES = ("minimal", "workload")
JOB_SIZE = 100
"""Pods per Job in the `workload` shape (its labels and owner are the Job's)."""


def add_shape_argument(parser: argparse.ArgumentParser, *, default: str, pods: str) -> None:
    """`--pod-shape`, as each benchmark that creates pods takes it; `pods` says which."""
    parser.add_argument(
        "--pod-shape",
        choices=SHAPES,
        default=default,
        help=f"{pods}: as a Job creates them (about 3 KiB in etcd) or the smallest there are",
    )


def bench_pod(
    name: str,
    number: int,
    *,
    scheduler: str,
    limits: dict[str, str],
    shape: str,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Pod `name`, the `number`th of its benchmark, in `shape`."""
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    container: dict[str, Any] = {
        "name": "c",
        "image": "busybox",
        "resources": {"limits": limits},
    }
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [container]}
    if asks_for_gpus({"spec": spec}):
        metadata["labels"] = dict(contract.GPU_POD_LABELS)
    if shape == "minimal":
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    if shape != "workload":
        raise ValueError(f"pod shape {shape!r}: expected one of {', '.join(SHAPES)}")
    job = f"train-{number // JOB_SIZE:04d}"
    job_uid = str(uuid.uuid5(uuid.NAMESPACE_URL, job))
    metadata["labels"] = {
        **metadata.get("labels", {}),
        "batch.kubernetes.io/controller-uid": job_uid,
        "batch.kubernetes.io/job-name": job,
        "controller-uid": job_uid,
        "job-name": job,
        "app.kubernetes.io/name": "train",
    }
    metadata["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job,
            "uid": job_uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    token_volume = f"kube-api-access-{job_uid[:5]}"
    container.update(
        name="train",
        image="registry.example.com/ml/train:2026.12.1",
        command=["python", "-m", "train"],
        args=["--epochs", "10", "--data", "/data", "--checkpoint", "/data/checkpoints"],
        env=[
            {"name": "PYTHONUNBUFFERED", "value": "1"},
            {"name": "DATA_DIR", "value": "/data"},
            {"name": "NCCL_DEBUG", "value": "WARN"},
            {
                "name": "POD_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            },
        ],
        volumeMounts=[
            {"name": "data", "mountPath": "/data"},
            {
                "name": token_volume,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            },
        ],
    )
    spec.update(
        restartPolicy="Never",
        serviceAccountName="default",
        automountServiceAccountToken=False,  # the volume below is what its admission writes
        volumes=[
            {"name": "data", "emptyDir": {}},
            {
                "name": token_volume,
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {
                            "configMap": {
                                "name": "kube-root-ca.crt",
                                "items": [{"key": "ca.crt", "path": "ca.crt"}],
                            }
                        },
                        {
                            "downwardAPI": {
                                "items": [
                                    {
                                        "path": "namespace",
                                        "fieldRef": {
                                            "apiVersion": "v1",
                                            "fieldPath": "metadata.namespace",
                                        },
                                    }
                                ]
                            }
                        },
                    ],
                },
            },
        ],
        tolerations=[
            {
                "key": f"node.kubernetes.io/{condition}",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
            for condition in ("not-ready", "unreachable")
        ],
    )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
