# The gpushare device plugin image. Build from the repository root:
#   docker build -f docker/device-plugin.Dockerfile -t gpushare/device-plugin:0.1.0 .
# (Not built in this project's CI: its machines have no container engine.)
# NVML (libnvidia-ml.so) is not in the image: the NVIDIA container runtime mounts the node's
# driver library into a container that sets NVIDIA_VISIBLE_DEVICES (see the DaemonSet).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core core
COPY operator operator
COPY cli cli
COPY device_plugin device_plugin
COPY harness harness
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# Root: the kubelet's device-plugins folder on the host belongs to root (no capabilities).
EXPOSE 9402
ENTRYPOINT ["gpushare-device-plugin"]
