#!/bin/sh
# Container entrypoint: ROLE selects the process; `exec` so the process is PID 1 and receives
# SIGTERM directly (gunicorn drains: dlock/serving.py; the executor finishes its step).
set -eu
cd "$(dirname "$0")/.."
case "${ROLE:-}" in
  lockserver|payments|railproxy|railstub|admin)
    exec gunicorn -c settings/gunicorn.py settings.wsgi "$@" ;;
  executor)
    exec python manage.py run_executor \
      --owner-id "${EXECUTOR_OWNER_ID:-${HOSTNAME:-executor}}" \
      --metrics-port "${METRICS_PORT:-9100}" "$@" ;;
  ops)
    exec python manage.py "$@" ;;
  *)
    echo "dlock: ROLE is '${ROLE:-}'; set ROLE to one of: lockserver, payments, railproxy, railstub, admin, executor, ops" >&2
    exit 2 ;;
esac
