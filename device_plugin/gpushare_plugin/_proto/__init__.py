"""Generated stubs of the kubelet device-plugin API (see protos/generate.py)."""
