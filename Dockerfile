# goodput-exporter, the per-node daemon, for a DaemonSet on GPU nodes:
#
#   docker build -t goodput-exporter .
#   docker run --rm -p 9445:9445 goodput-exporter --simulate 2      # no GPU needed; then curl :9445/metrics
#
# Two stages on the same slim Python base. The builder turns the daemon and the training client's wire
# contract (client/, goodput-client, which the daemon imports) into wheels and installs them, with the runtime
# dependencies of pyproject.toml (`dependencies`, no extras: no torch, no test tools), into the virtual
# environment /opt/venv. The build tools (mixin/: rules, dashboards, chart files, docs, the demo) are not in it. The final stage copies that environment and nothing else of the build. No
# stage installs a compiler: every dependency ships binary wheels for CPython 3.11 on amd64 and arm64.
# tests/test_image.py lints this file with hadolint, checks these conventions, and builds, installs and runs
# the package the way the builder does.

FROM python:3.11-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /src
# what building the wheels reads (.dockerignore keeps caches and bytecode out of exporter/ and client/)
COPY pyproject.toml README.md ./
COPY exporter/ exporter/
COPY client/ client/

# The environment gets no pip of its own: the base image's pip installs into it (--python), so the final
# image holds the exporter and its dependencies only.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ./client . \
    && python -m venv --without-pip /opt/venv \
    && pip --python /opt/venv/bin/python install --no-cache-dir /wheels/goodput_client-*.whl \
        /wheels/goodput_exporter-*.whl


FROM python:3.11-slim-bookworm

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="goodput-exporter" \
      org.opencontainers.image.description="Per-node GPU goodput telemetry for AI clusters: NVML, host and training-step data as Prometheus metrics" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/goodput-exporter/goodput-exporter"

# A fixed numeric user, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd. The
# directory of the default events socket and flight-recorder dumps (ingest.socket_path, flight.dir) is
# theirs; on Kubernetes a hostPath shared with the training pods is mounted there. The base image's pip,
# setuptools and wheel are removed: the running image has no installer on its PATH.
RUN groupadd --system --gid 65532 goodput \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin goodput \
    && mkdir -p /run/goodput-exporter/flight \
    && chown -R 65532:65532 /run/goodput-exporter \
    && python -m pip uninstall --yes --no-cache-dir pip setuptools wheel

COPY --from=builder /opt/venv /opt/venv

# NVML (libnvidia-ml.so.1) is not in the image: NVIDIA's container toolkit mounts the host driver's copy
# when the container runs under its runtime; these ask it for every GPU and the utility libraries only.
# Without it the daemon runs and reports goodput_exporter_source_up{source="nvml"} 0.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility

USER 65532:65532
EXPOSE 9445
ENTRYPOINT ["goodput-exporter"]
CMD ["serve"]
