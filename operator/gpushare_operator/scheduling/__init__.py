"""The operator's scheduling core: what it knows of the cluster and how it decides, no I/O.

- `podinfo`: a pod parsed once per event into the typed record everything below reads;
- `slim`: the fields of pods and nodes the reflectors keep (a real node lists tens of KiB);
- `cache`: nodes, GPU usage and pods, and a pod's life from pending to assumed to bound;
- `exactness`: the rule that same-request pods on a node wait for one another's assignment;
- `decision`: one decision, pure: where a pod goes now, or why it cannot (the CLI calls it);
- `queue`: which pending pod is tried next, and when a failed one is tried again.

The shell around it (`runtime`, `scheduler`, `status`, `reporting`, `election`, `kubeapi`)
feeds it events and carries its decisions to the API.
"""
