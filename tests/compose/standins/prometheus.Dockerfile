# CI stand-in for prom/prometheus (no image registry is reachable in CI): Debian's Prometheus,
# laid out like the real image (binary as entrypoint, /prometheus as working and data folder,
# run as nobody) plus wget for the compose healthcheck. Debian's build keeps its data under
# /var/lib/prometheus by default; the real image's default is data/ in /prometheus (the volume).
FROM local/debian:bookworm
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus wget \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus \
    && chown 65534:65534 /prometheus
WORKDIR /prometheus
USER 65534:65534
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus", "--storage.tsdb.path=/prometheus/data"]
CMD ["--config.file=/etc/prometheus/prometheus.yml"]
