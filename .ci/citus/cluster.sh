#!/usr/bin/env bash
# A local Citus cluster for tests: a coordinator and two worker nodes, each its own PostgreSQL 15 instance
# on 127.0.0.1 (ports BASE, BASE+1, BASE+2; default 9700), trust auth, run as the OS user postgres.
# Usage: cluster.sh start [DIR] | stop [DIR] | url      (DIR default /tmp/citus-cluster)
# After start: postgresql://postgres@127.0.0.1:9700/postgres is the coordinator, with citus created and both
# workers added. Build the extension first with build.sh.
set -euo pipefail
cmd=${1:-start}; dir=${2:-/tmp/citus-cluster}; base=${CITUS_PORT:-9700}
bin=/usr/lib/postgresql/15/bin
as_pg() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
case $cmd in
  url) echo "postgresql://postgres@127.0.0.1:$base/postgres" ;;
  stop)
    for i in 0 1 2; do [ -d "$dir/n$i" ] && as_pg "$bin/pg_ctl" -D "$dir/n$i" -m fast stop >/dev/null 2>&1 || true; done ;;
  start)
    mkdir -p "$dir"; chown postgres "$dir"
    for i in 0 1 2; do
      port=$((base + i)); d=$dir/n$i
      if [ ! -f "$d/PG_VERSION" ]; then
        as_pg "$bin/initdb" -D "$d" -U postgres --auth=trust >/dev/null
        cat >> "$d/postgresql.conf" <<CONF
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
shared_preload_libraries = 'citus'
max_connections = 200
max_prepared_transactions = 200
wal_level = logical
# a two-phase commit left in doubt by a lost worker node is finished within a second, not Citus's minute
citus.recover_2pc_interval = '1s'
CONF
      fi
      as_pg "$bin/pg_ctl" -D "$d" -l "$dir/n$i.log" -w start >/dev/null
      psql -qAt "postgresql://postgres@127.0.0.1:$port/postgres" -c "CREATE EXTENSION IF NOT EXISTS citus" >/dev/null
    done
    c="postgresql://postgres@127.0.0.1:$base/postgres"
    psql -qAt "$c" -c "SELECT citus_set_coordinator_host('127.0.0.1', $base)" >/dev/null
    for i in 1 2; do
      psql -qAt "$c" -c "SELECT citus_add_node('127.0.0.1', $((base + i))) WHERE NOT EXISTS (SELECT 1 FROM pg_dist_node WHERE nodeport = $((base + i)))" >/dev/null
    done
    psql -qAt "$c" -c "SELECT 'citus ' || citus_version(), count(*) || ' nodes' FROM pg_dist_node GROUP BY 1" ;;
  *) echo "usage: $0 start|stop|url [DIR]"; exit 2 ;;
esac
