# The gpushare device plugin image. From the repository root, with a container engine:
#   docker build -f docker/device-plugin.Dockerfile -t <registry>/gpushare/device-plugin:0.1.0 .
# or here, with no engine and no registry: `gpushare-dev images` (buildah, on a base made from
# Debian packages, passed as BASE).
# NVML (libnvidia-ml.so) is not in the image: the NVIDIA container runtime mounts the node's
# driver library into a container that sets NVIDIA_VISIBLE_DEVICES (see the DaemonSet).
# BASE: any image whose python3 is 3.11 or later, with its venv module (and libstdc++ for gRPC).
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
RUN python3 -c 'import sys, venv; assert sys.version_info >= (3, 11)' 2>/dev/null \
 || { echo "gpushare: the BASE image needs python3 >= 3.11 with its venv module" >&2; exit 1; }
RUN python3 -m venv /opt/gpushare
WORKDIR /src
COPY pyproject.toml README.md ./
COPY docker/constraints.txt docker/
COPY core core
COPY operator operator
COPY device_plugin device_plugin
COPY cli cli
# Only the plugin's dependencies (no kopf, grpcio-tools or test tools); pip and setuptools
# leave the final image.
RUN /opt/gpushare/bin/pip install --no-cache-dir --disable-pip-version-check \
      --constraint docker/constraints.txt '.[plugin]' \
 && /opt/gpushare/bin/pip uninstall --yes --quiet pip setuptools

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp PATH=/opt/gpushare/bin:${PATH} \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility
COPY --from=build /opt/gpushare /opt/gpushare
# Root: the kubelet's device-plugins folder on the host belongs to root (no capabilities).
EXPOSE 9402
ENTRYPOINT ["gpushare-device-plugin"]
