# CI stand-in for python:3.11-slim-bookworm (no image registry is reachable in CI): Debian's own
# Python 3.11 (with its C headers, as the real image has them) in a venv at /usr/local, so
# `python3` and `python3 -m pip` resolve as in the real image. The host's extra CA certificates
# are trusted here, and only here, so that pip reaches the package index through the CI network;
# the project's Dockerfiles never add them.
FROM local/debian:bookworm
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY ca/ /usr/local/share/ca-certificates/
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev ca-certificates \
    && update-ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /usr/local \
    && /usr/local/bin/python3 -m pip --version
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1
CMD ["python3"]
