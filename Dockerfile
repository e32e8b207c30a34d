# The Tiny Data Server images: tiny-data-server on 0.0.0.0:8000, data in the /data volume.
#
#   docker build --target ingest -t tiny:ingest .         # the whole server: ingest, the dashboard and
#                                                         # the downloads API (tornado, orjson,
#                                                         # prometheus-client, tiny + its compiled codec)
#   docker build --target analytics -t tiny:analytics .   # the same image (the default target: the name
#                                                         # older commands and compose files use)
#   docker compose up --scale tiny=4                      # with nginx in front (docker-compose.yml)
#   make images-offline                                   # with no registry (docker/build-offline.sh)
#
# Stages: `builder` installs Rust (Debian's packages) and maturin, builds the wheel of the package
# (tiny + tiny._codec) and /venv with requirements.txt's pins and that wheel; `runtime` is the
# user, entrypoint and settings; `ingest` is runtime + that /venv, and `analytics` the same image
# under a second name, kept so that compose files naming it go on working. No compiler,
# cargo, pip or crate reaches a final image.
#
# BASE_IMAGE: any Debian-like image with Python 3.11 and its venv module whose apt sources carry
# Rust >= 1.85 (rustc-web or rustc): python:3.11-slim from Docker Hub, or the Debian bookworm root
# that docker/build-offline.sh imports. The builder reaches PyPI and crates.io; build/extra-ca.pem,
# when present in the context (a TLS-intercepting proxy), is trusted by its pip and cargo, besides
# the base's CAs, and stays in the builder.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS builder
# the wildcard lets build/extra-ca.pem be absent
COPY docker/build-toolchain.sh build/extra-ca.pe[m] /opt/build/
RUN /opt/build/build-toolchain.sh
ENV PIP_CERT=/opt/build/ca.pem \
    SSL_CERT_FILE=/opt/build/ca.pem \
    CARGO_HTTP_CAINFO=/opt/build/ca.pem \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
# /opt/tools: pip and the pinned maturin, for building only. /venv, what the images get: no pip of
# its own (ensurepip takes 6 s and 12 MB), /opt/tools' pip installs into it.
COPY requirements.txt requirements-dev.txt /src/
RUN set -eu; \
    python3 -m venv /opt/tools; \
    /opt/tools/bin/pip install -q "$(grep -E '^maturin==' /src/requirements-dev.txt)"; \
    python3 -m venv --without-pip /venv; \
    /opt/tools/bin/pip --python /venv/bin/python install -q -r /src/requirements.txt
WORKDIR /src
# The crate first, built once with a placeholder package: its crates and compiled dependencies
# stay in this layer, so that a change to tiny/*.py alone does not compile Rust again.
COPY pyproject.toml /src/
COPY rust/tiny_codec /src/rust/tiny_codec/
RUN set -eu; \
    mkdir tiny; touch tiny/__init__.py; \
    /opt/tools/bin/maturin build --release --locked --interpreter /venv/bin/python -o /tmp/warm; \
    rm -rf tiny /tmp/warm
COPY tiny /src/tiny/
RUN set -eu; \
    /opt/tools/bin/maturin build --release --locked --interpreter /venv/bin/python -o /wheels; \
    /opt/tools/bin/pip --python /venv/bin/python install -q /wheels/tiny_data_server-*.whl; \
    ls -l /wheels

FROM ${BASE_IMAGE} AS runtime
RUN set -eu; \
    echo 'tiny:x:10001:10001:Tiny Data Server:/app:/usr/sbin/nologin' >> /etc/passwd; \
    echo 'tiny:x:10001:' >> /etc/group; \
    mkdir -p /data; \
    chown 10001:10001 /data
COPY docker/entrypoint.sh /app/
ENV PATH=/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TINY_ADDRESS=0.0.0.0 \
    TINY_PORT=8000 \
    TINY_DATA_DIR=/data
WORKDIR /app
VOLUME /data
EXPOSE 8000
USER 10001:10001
# 200 only while serving: 503 while draining, no answer while starting or gone
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/venv/bin/python", "-S", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('TINY_PORT', '8000'), timeout=2)"]
# The entrypoint only changes user when started as root (see docker/entrypoint.sh), then execs
# the app (the package's console script, tiny.main), which handles SIGTERM (drain, exit 0) from
# its first import on.
ENTRYPOINT ["/app/entrypoint.sh"]
CMD ["tiny-data-server"]

# The server: ingest, the dashboard and its API, the downloads API.
FROM runtime AS ingest
COPY --from=builder /venv /venv

# The same image under the name the default target had when it added polars: the last stage,
# so the default target.
FROM ingest AS analytics
