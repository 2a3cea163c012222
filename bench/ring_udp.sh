#!/usr/bin/env bash
# The Ring over real UDP on loopback, against Spread 4.4's figure on this
# machine (bench/RESULTS.md, "Ring over UDP"). Builds the example in
# release, then runs each configuration ROUNDS times, configurations
# alternated so that they share the machine's load, printing the load
# average before each run. Usage: bench/ring_udp.sh [ROUNDS] [SECS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-10}
cargo build --release -q -p shoal-net --example ring_throughput
BIN=target/release/examples/ring_throughput
for round in $(seq 1 "$ROUNDS"); do
  for cfg in "ring" "ring --safe" "sites" "sites --safe"; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    # shellcheck disable=SC2086
    line=$($BIN --engine $cfg --members 4 --secs "$SECS" --warmup 2 2>/dev/null | tail -1)
    echo "round $round load $load | $line"
  done
done
