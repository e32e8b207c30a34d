# The Tiny Data Server app image: python app.py on 0.0.0.0:8000, data in the /data volume.
#
#   docker compose up --scale tiny=4     # with nginx in front (docker-compose.yml)
#   make images-offline                  # both images with no registry (docker/build-offline.sh)
#
# BASE_IMAGE: any Debian-like image with Python 3.11 and its venv module; python:3.11-slim
# from Docker Hub, or the Debian root that docker/build-offline.sh imports.
# Wheels: build/wheels (filled on the host by `make images-offline`; absent in a fresh clone)
# is copied in when it exists. OFFLINE=1 installs from it alone (--no-index); otherwise pip
# uses PyPI. The compiled codec (tiny_codec, from `make codec`) is installed when its wheel is
# in build/wheels; without it the app uses its pure-Python codec (/healthz says which).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG OFFLINE=0
# requirements.txt and build/wheels/* land side by side; the wildcard lets build/wheels be absent
COPY requirements.txt build/wheel[s] /tmp/wheels/
# One RUN: the legacy builder costs seconds per instruction. The venv gets no pip of its own
# (ensurepip takes 6 s and 12 MB): the base's pip installs into it, or, on Debian's python3
# without pip, pip run from Debian's bundled wheel.
RUN set -eu; \
    python3 -m venv --without-pip /venv; \
    if python3 -m pip --version >/dev/null 2>&1; then pip="python3 -m pip --python /venv/bin/python"; \
    else pip="/venv/bin/python $(ls /usr/share/python-wheels/pip-*.whl | tail -n 1)/pip"; fi; \
    index=""; [ "$OFFLINE" = 1 ] && index="--no-index"; \
    $pip install --no-cache-dir --disable-pip-version-check --root-user-action=ignore $index --find-links /tmp/wheels \
        -r /tmp/wheels/requirements.txt; \
    codec=$(ls -t /tmp/wheels/tiny_codec-*.whl 2>/dev/null | head -n 1 || true); \
    if [ -n "$codec" ]; then \
        $pip install --no-cache-dir --disable-pip-version-check --root-user-action=ignore --no-index --no-deps "$codec" \
        || echo "$codec does not install here: the image uses the Python codec" >&2; \
    fi; \
    rm -rf /tmp/wheels; \
    echo 'tiny:x:10001:10001:Tiny Data Server:/app:/usr/sbin/nologin' >> /etc/passwd; \
    echo 'tiny:x:10001:' >> /etc/group; \
    mkdir -p /data; \
    chown 10001:10001 /data

COPY docker/entrypoint.sh app.py /app/
COPY tiny /app/tiny/

ENV PATH=/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TINY_ADDRESS=0.0.0.0 \
    TINY_PORT=8000 \
    TINY_DATA_DIR=/data \
    MPLCONFIGDIR=/tmp/matplotlib
WORKDIR /app
VOLUME /data
EXPOSE 8000
USER 10001:10001
# 200 only while serving: 503 while draining, no answer while starting or gone
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/venv/bin/python", "-S", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('TINY_PORT', '8000'), timeout=2)"]
# The entrypoint only changes user when started as root (see docker/entrypoint.sh), then execs
# the app, which handles SIGTERM (drain, exit 0) from its first import on.
ENTRYPOINT ["/app/entrypoint.sh"]
CMD ["python", "/app/app.py"]
