# The gpushare operator (scheduler) image. Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t gpushare/operator:0.1.0 .
# (Not built in this project's CI: its machines have no container engine.)
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
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# The Deployment runs it as this user, with a read-only root filesystem.
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["gpushare-operator"]
