"""gpushare operator: the kopf scheduler that places pods on GPU cards and binds them.

It imports the shared model (`gpushare.model`) for every rule; this package holds only the
adapters: kopf handlers, the assume cache, the queue, the binder and the Kubernetes calls.
"""
