"""gpushare device plugin: the grpcio kubelet plugin that advertises volcano.sh/gpu-memory
and volcano.sh/gpu-number and sets the container environment on Allocate.

It imports the shared model (`gpushare.model`) for every rule; this package holds only the
adapters: discovery (NVML or fake), health, the gRPC servers and the Kubernetes calls.
"""
