# Minimal image of the daemon. Point it at NATS with REBASER_NATS_URL (without one it runs an embedded server).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY rebaser_core ./rebaser_core
COPY rebaser_client ./rebaser_client
COPY rebaser_server ./rebaser_server
RUN pip install --no-cache-dir . && useradd --create-home rebaser
USER rebaser
ENTRYPOINT ["rebaser-server"]
