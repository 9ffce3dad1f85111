#!/usr/bin/env bash
# Keep-alive HTTP load for the trial scripts, made by wrk: CONNECTIONS connections GET PATH on
# 127.0.0.1:PORT for SECONDS. With USERS set, one wrk thread per connection, connection i sending
# `x-user-id: user-<i % USERS>`. Prints the responses by status (and per user when USERS is set),
# socket errors, the latency distribution (p50, p99, p99.9, max: wrk's), requests by second and
# failures (statuses other than 200 and 429) by second (scripts/http_load.lua). With CSV (a path),
# also one line per response there: unix time sent, user, latency ms, status (for
# scripts/cluster_p99.py; one thread per connection then too).
#
#   bash scripts/http_load.sh PORT PATH CONNECTIONS SECONDS [USERS [CSV]]
#
# Needs wrk (Debian: apt-get install wrk); it is the one tool here whose scripting can count by
# second and by user (oha, scripts/loadtest.sh's other load generator, reports totals only).
set -euo pipefail
(($# >= 4)) || { echo "usage: bash scripts/http_load.sh PORT PATH CONNECTIONS SECONDS [USERS]" >&2; exit 2; }
PORT=$1 URLPATH=$2 CONNECTIONS=$3 SECONDS_=$4 USERS=${5:-0} CSV=${6:-}
command -v wrk >/dev/null 2>&1 || { echo "http_load.sh: needs wrk (Debian: apt-get install wrk)" >&2; exit 1; }
THREADS=1
if ((USERS > 0)) || [[ -n $CSV ]]; then THREADS=$CONNECTIONS; fi
# wrk's report goes to stderr (the trial scripts read only the script's lines, on stdout).
HTTP_LOAD_USERS=$USERS HTTP_LOAD_CSV=$CSV wrk -t"$THREADS" -c"$CONNECTIONS" -d"${SECONDS_}s" --timeout 5s \
  -s "$(dirname "$0")/http_load.lua" "http://127.0.0.1:$PORT$URLPATH" |
  awk '/^(statuses|latency|requests by|failures by|  user-)/ {print; next} {print > "/dev/stderr"}'
