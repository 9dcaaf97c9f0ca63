# The gpushare operator (scheduler) image. From the repository root, with a container engine:
#   docker build -f docker/operator.Dockerfile -t <registry>/gpushare/operator:0.1.0 .
# or here, with no engine and no registry: `gpushare-dev images` (buildah, on a base made from
# Debian packages, passed as BASE).
# BASE: any image whose python3 is 3.11 or later, with its venv module.
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
# Only the operator's dependencies (no gRPC, NVML or test tools); pip and setuptools leave the
# final image, and so do type stubs (.pyi, 2 MB: read by type checkers, never at run time).
RUN /opt/gpushare/bin/pip install --no-cache-dir --disable-pip-version-check \
      --constraint docker/constraints.txt '.[operator]' \
 && /opt/gpushare/bin/pip uninstall --yes --quiet pip setuptools \
 && find /opt/gpushare -name '*.pyi' -delete

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp PATH=/opt/gpushare/bin:${PATH}
COPY --from=build /opt/gpushare /opt/gpushare
# The Deployment runs it as this user, with a read-only root filesystem. It has a name (kopf
# asks the system for the user's name, which fails for a uid the image does not know).
RUN echo 'gpushare:x:65532:65532:gpushare:/tmp:/usr/sbin/nologin' >> /etc/passwd \
 && echo 'gpushare:x:65532:' >> /etc/group
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["gpushare-operator"]
