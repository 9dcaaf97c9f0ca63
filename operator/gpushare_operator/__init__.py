"""gpushare operator: the kopf scheduler that places pods on GPU cards and binds them.

Every rule comes from the shared model (`gpushare.model`). `scheduling/` is the operator's own
core, pure of I/O (what it knows of pods and nodes, the exactness rule, one decision, the
queue); the rest is the shell that feeds it and carries out its decisions: the runtime, the
binder, Events and status, the Lease, the Kubernetes calls, and kopf's handlers.
"""
