#!/usr/bin/env bash
# Make sure the system packages dlock needs exist: PostgreSQL server binaries, etcd, nginx (the
# proxy in front of every role), openssl (make up TLS=1), and for the browser and alerting tests
# headless Chromium + chromedriver (Selenium) and promtool (prometheus), nftables (the HA
# experiment's partition), zookeeper (the lock peers' ZooKeeper arm: its token-check test in
# `make test`, and `make bench`); for `make bench` also redis-server (WITH_REDIS=1).
# As root, installs what is missing with apt-get; otherwise says exactly what to install.
set -euo pipefail
missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
[ -x /usr/sbin/nginx ] || missing+=(nginx)
# nginx's stream module (the per-address cap at accept, deploy/nginx/nginx.conf.template)
[ -f /usr/lib/nginx/modules/ngx_stream_module.so ] || missing+=(libnginx-mod-stream)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# nft: the HA experiment's real partition of an etcd member (devstack/netcut.py)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
if [ "${WITH_REDIS:-0}" = 1 ]; then command -v redis-server >/dev/null 2>&1 || missing+=(redis-server); fi
# The ZooKeeper peer of the lock benchmark (bench/zookeeper.py runs the packaged server jar);
# tests/experiment/test_bench_peers.py starts one, so the suite needs it too.
{ [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; } || missing+=(zookeeper)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "[dlock] installing system packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  # Debian starts packaged services on install where it can; dlock runs its own private ones.
  for svc in etcd postgresql redis-server prometheus zookeeper nginx; do
    (service "$svc" stop >/dev/null 2>&1 || true)
  done
else
  echo "[dlock] missing system packages: ${missing[*]}" >&2
  echo "[dlock] install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
