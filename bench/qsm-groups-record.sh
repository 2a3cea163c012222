#!/bin/bash
# perf record (cpu-clock, 4999 Hz) of the three daemons of one `shoal bench
# --qsm` run from the end of the joins; report with
# `perf report -i OUT.data --no-children --sort sym -n`.
# Usage: bench/qsm-groups-record.sh GROUPS COUNT OUT   (OUT: an absolute path prefix)
g=$1; n=$2; out=$3
cd "$(dirname "$0")/.."
./target/release/shoal bench --daemons 3 --count $n --groups $g --qsm > $out.bench 2>&1 &
bp=$!
for i in $(seq 1 600); do
  if [ "$g" = 1 ]; then sleep 1; break; fi
  grep -q "groups joined" $out.bench 2>/dev/null && break
  sleep 0.1
done
pids=$(pgrep -P $bp | paste -sd,)
perf record -F 4999 -p $pids -o $out.data 2> $out.perf-err &
pp=$!
wait $bp
kill -INT $pp; wait $pp
grep -E "cpu:|stream:" $out.bench | sed 's/latency.*primary//'
