"""gpushare CLI (`gpushare`, also the kubectl plugin `kubectl gpushare`): inspect, explain,
simulate. Read-only.

By job: `read` reads the cluster (paged LISTs) and Pod manifests, `report` builds reports
from the shared model and the operator's own cache and decision, `render` writes them as
text or JSON, `main` parses arguments and maps errors to exit codes. It never imports kopf or
the operator's runtime and handlers (enforced by import-linter).
"""
