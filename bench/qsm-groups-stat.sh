#!/bin/bash
# perf stat (software events and socket/epoll system calls) of the three
# daemons of one `shoal bench --qsm` run, attached from the end of the
# joins (bench/RESULTS.md, "1 group against 10,000, perf stat").
# Usage: bench/qsm-groups-stat.sh GROUPS COUNT   (from the repository root)
# SHOAL=path runs another build than target/release/shoal.
g=$1; n=$2; out=$(mktemp -d)
shoal=${SHOAL:-./target/release/shoal}
cd "$(dirname "$0")/.."
EV=task-clock,context-switches,cpu-migrations,page-faults,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_read,syscalls:sys_enter_recvfrom,syscalls:sys_enter_recvmsg,syscalls:sys_enter_sendto
l=$(cut -d' ' -f1 /proc/loadavg)
$shoal bench --daemons 3 --count $n --groups $g --qsm > $out/bench 2>&1 &
bp=$!
for i in $(seq 1 600); do
  if [ "$g" = 1 ]; then sleep 1; break; fi
  grep -q "groups joined" $out/bench 2>/dev/null && break
  sleep 0.05
done
pids=$(pgrep -P $bp -d, -f "daemon --log")
perf stat -x, -e $EV -p $pids -o $out/perf.csv > /dev/null 2>&1 &
pp=$!
wait $bp
kill -INT $pp; wait $pp 2>/dev/null
echo "groups $g load $l: $(grep -o '= [0-9]* msgs/s' $out/bench) $(grep -o 'daemons [0-9.]* s ([0-9.]* µs' $out/bench) $(grep -o 'clients [0-9.]* s ([0-9.]* µs' $out/bench)"
awk -F, -v c="$n" '/task-clock/ {printf "  task-clock %.2f us/msg", $1*1000/c} /context-switches|cpu-migrations|page-faults/ {printf "  %s %.4f/msg", $3, $1/c} /syscalls/ { split($3, a, "sys_enter_"); printf "  %s %.4f/msg", a[2], $1 / c } END { print "" }' $out/perf.csv
rm -rf $out
