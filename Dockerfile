# The daemon's image. Without REBASER_NATS_URL it runs an embedded nats-server (store in the volume, port 4222);
# with one (as in docker-compose.yml) it joins that NATS. Health, readiness and Prometheus metrics on port 9464.
# Checked by `make validate` (hadolint) in CI.

# The base of both stages. The default is the one users get; the container tests (tests/container/) pass a Debian
# base made locally, since they run where no image registry is reachable (docs/deployment.md).
ARG BASE_IMAGE=python:3.11-slim

# -- build: a virtualenv with the package and its dependencies (the nats-server binary comes with them) --------
FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/rebaser
COPY pyproject.toml README.md ./
COPY rebaser_core ./rebaser_core
COPY rebaser_client ./rebaser_client
COPY rebaser_server ./rebaser_server
# The otlp extra: the daemons export traces to a collector when OTEL_TRACES_EXPORTER=otlp (docker-compose.yml).
RUN /opt/rebaser/bin/pip install --no-cache-dir ".[otlp]"

# -- run: the virtualenv on a clean slim base, as an unprivileged user ----------------------------------------
FROM ${BASE_IMAGE}
# A fixed numeric id, so file ownership in the volume means the same on every host and orchestrator.
RUN groupadd --system --gid 10001 rebaser \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/rebaser --create-home rebaser
COPY --from=build /opt/rebaser /opt/rebaser
# Inside a container "reachable" means on every interface: the container's network is the fence. The embedded
# server and the health endpoint bind 0.0.0.0 (both are loopback-only by default outside a container).
# The embedded server fsyncs before it acknowledges (its default, --sync always), so an acknowledged request
# survives the host losing power (docs/RELIABILITY.md); REBASER_SYNC=1s is faster and loses up to that much in a
# power loss. The image serves both modes, so it leaves REBASER_SYNC unset: beside REBASER_NATS_URL the daemon
# refuses it (an external server's fsync is in that server's configuration).
ENV PATH=/opt/rebaser/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    REBASER_DATA_DIR=/var/lib/rebaser \
    REBASER_EMBEDDED_HOST=0.0.0.0 \
    REBASER_HTTP_HOST=0.0.0.0 \
    REBASER_HTTP_PORT=9464 \
    REBASER_LOG_FORMAT=json
USER 10001:10001
WORKDIR /var/lib/rebaser
# The embedded server's JetStream store: requests and change-set records survive a new container.
VOLUME ["/var/lib/rebaser"]
# 4222: the embedded nats-server (clients). 9464 (REBASER_HTTP_PORT): the daemon's health port, plain HTTP, GET
# only: /healthz (200 while the process is alive: the HEALTHCHECK below), /readyz (200 once ready to take work, 503
# while starting, shutting down, a stream missing, the backlog over REBASER_READY_MAX_BACKLOG or NATS gone too
# long), /status (JSON) and /metrics (Prometheus). /status and /metrics name workspaces: off the container they
# answer only with REBASER_HTTP_TOKEN or REBASER_HTTP_TOKEN_FILE set, and the bearer token sent. Nothing else is
# served there: no web console (`rebaser console`, a separate process) and no API (docs/deployment.md).
EXPOSE 4222 9464
# No curl in a slim image: the image's own Python asks /healthz (on the port the daemon was given).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('REBASER_HTTP_PORT', '9464') + '/healthz', timeout=2)"]
ENTRYPOINT ["rebaser-server"]
