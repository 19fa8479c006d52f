#!/usr/bin/env bash
# Debian packages the integration tests start for real: gcc (fake NVML; the compiled
# remote-write reader with protobuf-c and xxHash), Slurm and munge,
# Prometheus (promtool, dashboard queries, remote-write receiver), Alertmanager, VictoriaMetrics
# (remote-write target), Chromium (the status page), PostgreSQL (the storage suite's second
# backend: initdb + pg_ctl of a private server), and slurmdbd + MariaDB (the Slurm cluster's
# accounting variant, for sacct: mariadb-install-db + mariadbd of a private server).
# Installs only what is missing; needs root (CI runs as root). Without root it says what to run.
set -euo pipefail
pkgs=()
command -v gcc >/dev/null || pkgs+=(gcc libc6-dev)
# the collector's compiled remote-write reader (setup.py): protobuf-c's generator, headers and
# library, and xxHash's header; without them pip leaves it out and the reader stays in Python
command -v protoc-c >/dev/null || pkgs+=(protobuf-c-compiler)
[ -e /usr/include/protobuf-c/protobuf-c.h ] || pkgs+=(libprotobuf-c-dev)
[ -e /usr/include/xxhash.h ] || pkgs+=(libxxhash-dev)
command -v slurmctld >/dev/null || pkgs+=(slurmctld)
command -v slurmd >/dev/null || pkgs+=(slurmd)
command -v sbatch >/dev/null || pkgs+=(slurm-client)
command -v munged >/dev/null || pkgs+=(munge)
[ -x /usr/sbin/slurmdbd ] || pkgs+=(slurmdbd)
[ -x /usr/sbin/mariadbd ] || pkgs+=(mariadb-server)
command -v promtool >/dev/null || pkgs+=(prometheus)
[ -x /usr/bin/prometheus-alertmanager ] || pkgs+=(prometheus-alertmanager)
[ -x /usr/bin/victoria-metrics ] || pkgs+=(victoria-metrics)
command -v chromium >/dev/null || pkgs+=(chromium)
# the IANA time zones quiet-hours policies name (zoneinfo reads /usr/share/zoneinfo)
[ -e /usr/share/zoneinfo/Europe/Berlin ] || pkgs+=(tzdata)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null \
  || pkgs+=(postgresql)
[ ${#pkgs[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "note: missing ${pkgs[*]}; install them (apt-get install ${pkgs[*]}) or those tests skip" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null
# The Debian packages start daemons under systemd where it runs (postgresql: its "main"
# cluster); the tests start their own, on private directories and free loopback ports.
