"""gpushare: GPU-memory sharing for Kubernetes, wire-compatible with Volcano's GPU Sharing.

`gpushare.model` is the pure core every component imports: the operator (scheduler), the
device plugin and the CLI. Nothing in it performs I/O.
"""
