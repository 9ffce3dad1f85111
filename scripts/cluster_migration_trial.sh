#!/usr/bin/env bash
# A slot migration under load through the example server on a 3-primary Redis Cluster (ports
# 47101-47103), as a user would see it: 16 keep-alive connections for 8 s (wrk, scripts/http_load.sh)
# on one key; 2 s in, its slot moves (SETSLOT IMPORTING/MIGRATING, 1 s, MIGRATE, 2 s, SETSLOT NODE).
# Prints the responses by status, the latency (p50, p99, max), requests/s by second, the server's
# log lines during the migration, and where the key ended up.
#
#   cargo build --release --example server --all-features
#   bash scripts/cluster_migration_trial.sh                      # default log filter, Lua mode
#   MODE=cell bash scripts/cluster_migration_trial.sh 'info,redis=error'
#
# BIN (default target/release/examples/server), MODE (lua | cell | auto), REDIS_CELL_MODULE.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
D=$(mktemp -d /tmp/cluster-trial-XXXX)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/server}
MODULE=${REDIS_CELL_MODULE:-$ROOT/target/redis-cell/libredis_cell.so}
PORTS="47101 47102 47103"
HTTP=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
for p in $PORTS; do
  mkdir -p $D/n$p; rm -f $D/n$p/nodes.conf
  redis-server --port $p --bind 127.0.0.1 --dir $D/n$p --cluster-enabled yes --cluster-config-file nodes.conf \
    --save '' --appendonly no --loadmodule $MODULE --daemonize yes --logfile $D/n$p/log
done
sleep 0.5
redis-cli --cluster create 127.0.0.1:47101 127.0.0.1:47102 127.0.0.1:47103 --cluster-replicas 0 --cluster-yes >/dev/null
until [ "$(redis-cli -p 47101 cluster info | grep -c 'cluster_state:ok')" = 1 ]; do sleep 0.2; done
sleep 1
cat > $D/config.toml <<TOML
listen = "127.0.0.1:$HTTP"
on_backend_error = "deny"
[backend]
kind = "redis"
urls = ["redis://127.0.0.1:47101/", "redis://127.0.0.1:47102/", "redis://127.0.0.1:47103/"]
mode = "${MODE:-lua}"
deny_cache = false
[[route]]
name = "index"
path = "/"
key = "ip"
max_burst = 200000
count = 10000
period = "1s"
TOML
if [ -n "${1:-}" ]; then export RUST_LOG="$1"; else unset RUST_LOG; fi
$BIN --config $D/config.toml 2> $D/server.err > $D/server.out &
SPID=$!
sleep 1
bash $ROOT/scripts/http_load.sh $HTTP / 16 8 > $D/load.txt 2> $D/wrk.txt &
LPID=$!
sleep 2
KEY=$(for p in $PORTS; do redis-cli -p $p --scan --pattern 'throttle:*'; done | head -1)
SLOT=$(redis-cli -p 47101 cluster keyslot "$KEY")
SRC=""; for p in $PORTS; do if [ -n "$(redis-cli -p $p cluster countkeysinslot $SLOT | grep -v '^0$')" ]; then SRC=$p; fi; done
for p in $PORTS; do [ "$p" != "$SRC" ] && DST=$p && break; done
SRCID=$(redis-cli -p $SRC cluster myid); DSTID=$(redis-cli -p $DST cluster myid)
L0=$(wc -l < $D/server.err); T0=$(date +%s.%N)
redis-cli -p $DST cluster setslot $SLOT importing $SRCID >/dev/null
redis-cli -p $SRC cluster setslot $SLOT migrating $DSTID >/dev/null
sleep 1
redis-cli -p $SRC migrate 127.0.0.1 $DST "" 0 5000 KEYS "$KEY" >/dev/null
sleep 2
for p in $DST $SRC $PORTS; do redis-cli -p $p cluster setslot $SLOT node $DSTID >/dev/null; done
T1=$(date +%s.%N); L1=$(wc -l < $D/server.err)
wait $LPID
echo "after: key on source $SRC: $(redis-cli -p $SRC exists "$KEY") (pttl $(redis-cli -p $SRC pttl "$KEY")), on target $DST: $(redis-cli -p $DST exists "$KEY")"
echo "key $KEY slot $SLOT moved $SRC -> $DST; migration $(echo "$T1 - $T0" | bc) s; server stderr lines during it: $((L1 - L0)) (RUST_LOG=${1:-default})"
cat $D/load.txt
kill $SPID; wait $SPID 2>/dev/null
for p in $PORTS; do redis-cli -p $p shutdown nosave >/dev/null 2>&1; done
sed -E 's/^[^ ]+ +//; s/[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+:[0-9]+/ADDR/g' $D/server.err | cut -c1-140 | sort | uniq -c | sort -rn | head -6
rm -rf "$D"
