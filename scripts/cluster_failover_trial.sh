#!/usr/bin/env bash
# A Redis Cluster primary killed under load, through the example server, as a user would see it:
# 3 primaries + 3 replicas (ports 47111-47116, cluster-node-timeout 1000, require-full-coverage no),
# 24 keep-alive connections for 12 s as 12 users (wrk, scripts/http_load.sh; x-user-id, spread over
# the primaries); 3 s in, the primary of user-0's slot is killed (SIGKILL). Failures answer 503
# (on_backend_error = "deny"). Prints the responses by status and per user, the latency (p50, p99,
# max), requests and failures by second, when the replica was promoted, and the server's log lines
# after the kill.
#
# With P99=1, the latency of each primary's users instead (scripts/cluster_p99.py): p50, p99 and max
# before the kill, from the kill to the replica's promotion ("dying") and after, and the healthy
# primaries' p99 dying/before. With BIN2 too, the same trial again with that build (say, main's), on
# a fresh Cluster, so that the two compare within one run on a loaded machine; the load average is
# printed before each.
#
#   cargo build --release --example server --all-features
#   bash scripts/cluster_failover_trial.sh                  # default log filter
#   bash scripts/cluster_failover_trial.sh 'info,redis=error'
#   P99=1 BIN2=/tmp/main-target/release/examples/server bash scripts/cluster_failover_trial.sh
#
# BIN (default target/release/examples/server), BIN2, P99, REDIS_CELL_MODULE.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/server}
MODULE=${REDIS_CELL_MODULE:-$ROOT/target/redis-cell/libredis_cell.so}
PORTS="47111 47112 47113 47114 47115 47116"
trial() {
BIN=$1; shift
D=$(mktemp -d /tmp/cluster-failover-XXXX)
HTTP=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
echo "== $BIN (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
for p in $PORTS; do
  mkdir -p $D/n$p
  redis-server --port $p --bind 127.0.0.1 --dir $D/n$p --cluster-enabled yes --cluster-config-file nodes.conf \
    --cluster-node-timeout 1000 --cluster-require-full-coverage no \
    --save '' --appendonly no --loadmodule $MODULE --daemonize yes --logfile $D/n$p/log
done
sleep 0.5
redis-cli --cluster create $(for p in $PORTS; do echo 127.0.0.1:$p; done) --cluster-replicas 1 --cluster-yes >/dev/null
until [ "$(redis-cli -p 47111 cluster info | grep -c 'cluster_state:ok')" = 1 ]; do sleep 0.2; done
for p in $PORTS; do
  until redis-cli -p $p info replication | grep -qE 'role:master|master_link_status:up'; do sleep 0.2; done
done
cat > $D/config.toml <<TOML
listen = "127.0.0.1:$HTTP"
on_backend_error = "deny"
[backend]
kind = "redis"
urls = ["redis://127.0.0.1:47111/", "redis://127.0.0.1:47112/", "redis://127.0.0.1:47113/"]
mode = "lua"
deny_cache = false
[[route]]
name = "index"
path = "/"
key = "header:x-user-id"
max_burst = 200000
count = 10000
period = "1s"
TOML
if [ -n "${1:-}" ]; then export RUST_LOG="$1"; else unset RUST_LOG; fi
$BIN --config $D/config.toml 2> $D/server.err > $D/server.out &
SPID=$!
sleep 1
bash $ROOT/scripts/http_load.sh $HTTP / 24 12 12 ${P99:+$D/latency.csv} > $D/load.txt 2> $D/wrk.txt &
LPID=$!
sleep 3
# Each user's primary (for P99): the primary that answers GET for its key without MOVED.
NODES=""
for p in $PORTS; do
  redis-cli -p $p role | head -1 | grep -q master || continue
  USERS=""
  for u in $(seq 0 11); do
    redis-cli -p $p get "throttle:index:{user-$u}" | grep -q MOVED || USERS="$USERS,user-$u"
  done
  NODES="$NODES $p=${USERS#,}"
done
KEY='throttle:index:{user-0}'
SLOT=$(redis-cli -p 47111 cluster keyslot "$KEY")
VICTIM=""
for p in $PORTS; do
  # The slot's primary answers GET itself; the others redirect (MOVED) or are replicas.
  if redis-cli -p $p role | head -1 | grep -q master && ! redis-cli -p $p get "$KEY" | grep -q MOVED; then VICTIM=$p; fi
done
[ -n "$VICTIM" ] || { echo "no primary owns slot $SLOT" >&2; exit 1; }
VID=$(redis-cli -p $VICTIM cluster myid)
REPLICA=$(redis-cli -p $VICTIM cluster nodes | awk -v id=$VID '$4 == id { split($2, a, "[:@]"); print a[2] }')
L0=$(wc -l < $D/server.err); T0=$(date +%s.%N)
kill -9 "$(redis-cli -p $VICTIM info server | awk -F: '/^process_id/ { print $2 }' | tr -d '\r')"
[ -n "$REPLICA" ] || { echo "primary $VICTIM has no replica" >&2; exit 1; }
for _ in $(seq 1500); do redis-cli -p $REPLICA role 2>/dev/null | head -1 | grep -q master && break; sleep 0.02; done
T1=$(date +%s.%N)
wait $LPID
L1=$(wc -l < $D/server.err)
echo "user-0's slot $SLOT: primary $VICTIM killed; replica $REPLICA promoted $(echo "$T1 - $T0" | bc) s later; server stderr lines from the kill to the end of the load: $((L1 - L0)) (RUST_LOG=${1:-default})"
cat $D/load.txt
if [ -n "${P99:-}" ]; then
  # The killed primary first.
  ORDERED="$(echo $NODES | tr ' ' '\n' | grep "^$VICTIM=") $(echo $NODES | tr ' ' '\n' | grep -v "^$VICTIM=")"
  python3 $ROOT/scripts/cluster_p99.py $D/latency.csv $T0 $T1 $ORDERED
fi
kill $SPID; wait $SPID 2>/dev/null
for p in $PORTS; do redis-cli -p $p shutdown nosave >/dev/null 2>&1; done
sed -E 's/^[^ ]+ +//; s/[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+:[0-9]+/ADDR/g' $D/server.err | cut -c1-140 | sort | uniq -c | sort -rn | head -6
grep -o "error=[^=]*on_error" $D/server.err | sed -E "s/[0-9]+ 127/N 127/" | sort | uniq -c | sort -rn | head -8
[ -n "${KEEP:-}" ] && echo "kept $D" || rm -rf "$D"
}
trial "$BIN" "$@"
if [ -n "${BIN2:-}" ]; then trial "$BIN2" "$@"; fi
