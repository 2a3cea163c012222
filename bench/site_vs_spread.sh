#!/bin/bash
# The Ring inside a site against Spread 4.4's single daemon, side by side
# (issue 26's goal: total order inside a site at 2x Spread's throughput).
#
# Usage (as root, from the repository): bench/site_vs_spread.sh [ROUNDS] [COUNT]
# Needs Spread 4.4 built as ../shared/peers/spread/README.md says
# (/tmp/spread-build) and `cargo build --release -p shoal`.
#
# Each round, one after the other:
#   spread:  Spread's single loopback daemon, 4 members (Unix sockets),
#            member 0 sends 1000-byte AGREED messages, window 200, every
#            member counts deliveries over 20 s after 3 s (spbench tput).
#   site1:   one `shoal site` daemon (a site of one daemon) with 4 clients
#            over its Unix socket; `shoal bench` stream, 1 sender, agreed,
#            1000 B, COUNT messages (msgs/s per receiver).
#   site3:   a site of three `shoal site` daemons on 127.0.0.1 (the Ring
#            between them), 4 clients on daemons 0, 1, 2, 0, the same bench.
set -u
ROUNDS=${1:-3}; COUNT=${2:-600000}
REPO=$(cd "$(dirname "$0")/.." && pwd)
SHOAL=${SHOAL:-$REPO/target/release/shoal}
PEERS=$REPO/../shared/peers/spread
B=/tmp/spread-build
W=$(mktemp -d /tmp/site-vs-spread.XXXXXX)
trap 'pkill -f "shoal site --config $W" 2>/dev/null; "$PEERS/daemon_lo.sh" stop >/dev/null 2>&1; rm -rf "$W"' EXIT
cat > "$W/site1.toml" <<T
[[site]]
name = "lan"
daemons = [{ id = 0, addr = "127.0.0.1:4911" }]
T
cat > "$W/site3.toml" <<T
[[site]]
name = "lan"
daemons = [{ id = 0, addr = "127.0.0.1:4901" }, { id = 1, addr = "127.0.0.1:4902" }, { id = 2, addr = "127.0.0.1:4903" }]
T

spread_round() {
  "$PEERS/daemon_lo.sh" start >/dev/null
  local f=$W/spread.txt pids=()
  : > "$f"
  for i in 0 1 2 3; do
    s=0; [ $i -eq 0 ] && s=1
    $B/spbench -s 4803 -u m$i -g gsv$1 -n 4 -m tput -S $s -t agreed -b 1000 -w 200 -W 3 -D 20 >> "$f" 2>&1 &
    pids+=($!)
  done
  wait "${pids[@]}"
  "$PEERS/daemon_lo.sh" stop >/dev/null
  # The slowest member's rate.
  grep -o 'msgs_per_s=[0-9.]*' "$f" | cut -d= -f2 | sort -n | head -1
}

site_round() { # daemons config
  local n=$1 cfg=$2 socks=() pids=()
  rm -f "$W"/s*.sock
  for id in $(seq 0 $((n - 1))); do
    "$SHOAL" site --config "$cfg" --id $id --socket "$W/s$id.sock" --run-for 600 >/dev/null 2>&1 &
    pids+=($!)
  done
  for id in $(seq 0 $((n - 1))); do socks+=("$W/s$id.sock"); done
  [ "$n" -eq 1 ] && list="$W/s0.sock,$W/s0.sock,$W/s0.sock,$W/s0.sock" || list="$W/s0.sock,$W/s1.sock,$W/s2.sock,$W/s0.sock"
  for s in "${socks[@]}"; do for _ in $(seq 100); do [ -S "$s" ] && break; sleep 0.1; done; done
  "$SHOAL" bench --sockets "$list" --service agreed --size 1000 --count "$COUNT" 2>/dev/null \
    | grep -o '= [0-9]* msgs/s per receiver' | grep -o '[0-9]*'
  kill "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
}

echo "round,load,spread_agreed,site1_agreed,site3_agreed"
for r in $(seq 1 "$ROUNDS"); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  sp=$(spread_round $r)
  s1=$(site_round 1 "$W/site1.toml")
  s3=$(site_round 3 "$W/site3.toml")
  echo "$r,$load,$sp,$s1,$s3"
done
