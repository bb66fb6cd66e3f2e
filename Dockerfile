# dlock: one image, every role. ROLE selects the process (scripts/container-entrypoint.sh):
#   lockserver | payments | railproxy | railstub | admin -> gunicorn -c settings/gunicorn.py settings.wsgi
#   executor                                        -> manage.py run_executor
#   ops                                             -> manage.py <args> (migrate, reconcile, ...)
# Build: docker build -t dlock:dev .    Run: docker run -e ROLE=railstub -e ... dlock:dev

# ---- build stage: a virtualenv with the runtime dependencies only ---------------------------
FROM python:3.11-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements.lock ./
# The runtime lock only (requirements-dev.lock, pytest, ruff, ... stay out): every package pinned
# with its hashes, nothing resolved here (--no-deps), a file whose hash differs is refused.
# Every runtime dependency but one ships wheels (psycopg[binary]); gunicorn_h1c (gunicorn's C
# request parser) is an sdist, compiled here: the compiler stays in this stage.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-compile --require-hashes --no-deps -r requirements.lock \
 && /opt/venv/bin/pip uninstall -y pip setuptools wheel

# ---- final stage: no build tools, no pip, non-root ------------------------------------------
FROM python:3.11-slim-bookworm
# The release the image says it runs (service_started's `version`); `make image` passes
# pyproject's version.
ARG DLOCK_VERSION=unknown
ENV DLOCK_VERSION=$DLOCK_VERSION \
    PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DLOCK_ENVIRONMENT=production \
    DJANGO_DEBUG=false \
    BIND_HOST=0.0.0.0 \
    PORT=8080
RUN groupadd --system --gid 10001 dlock \
 && useradd --system --uid 10001 --gid dlock --no-create-home --shell /usr/sbin/nologin dlock \
 && python -m pip uninstall -y pip setuptools wheel
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# .dockerignore is an allow-list: only the application code reaches this layer.
COPY --chown=root:root . /app
# Code stays root-owned and read-only for the service user, world-readable whatever the umask
# of the checkout it was built from (COPY keeps 0600/0700 modes); bytecode compiled once here
# so a pod start does not pay for it (PYTHONDONTWRITEBYTECODE only stops writing at run time).
RUN python -m compileall -q -j 0 /app /opt/venv/lib \
 && chmod -R a+rX,go-w /app /opt/venv
USER 10001:10001
EXPOSE 8080 9100
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "scripts/container-healthcheck.py"]
ENTRYPOINT ["/bin/sh", "/app/scripts/container-entrypoint.sh"]
