#!/bin/bash
# The three bench daemons' socket system calls per message over one
# `shoal bench --qsm` run (bench/RESULTS.md, "Why region multicast is not
# faster on loopback"). Needs perf with access to the syscall tracepoints.
# Usage: bench/qsm-syscalls.sh COUNT [more bench arguments, e.g. --qsm-multicast]
set -u
C=$1; shift
EXE=${SHOAL:-./target/release/shoal}
OUT=$(mktemp -d)
EV=syscalls:sys_enter_sendmmsg,syscalls:sys_enter_sendmsg,syscalls:sys_enter_sendto,syscalls:sys_enter_recvmmsg,syscalls:sys_enter_recvmsg,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait
rcvbuf() { awk '/^Udp:/{n++; if (n == 2) print $6}' /proc/net/snmp; }
rb0=$(rcvbuf)
"$EXE" bench --daemons 3 --count "$C" --qsm "$@" > "$OUT/bench.out" 2>&1 &
B=$!
pids=
for _ in $(seq 1 100); do
  pids=$(pgrep -P $B -d, -f "daemon --log")
  [ "$(echo "$pids" | tr ',' '\n' | grep -c .)" -ge 3 ] && break
  sleep 0.05
done
perf stat -x, -e "$EV" -p "$pids" -o "$OUT/perf.csv" > /dev/null 2>&1 &
P=$!
wait $B
sleep 0.3
kill -INT $P 2> /dev/null
wait $P 2> /dev/null
rb1=$(rcvbuf)
grep -o "= [0-9]* msgs/s" "$OUT/bench.out" | tr '\n' ' '
grep -o "daemons [0-9.]* s ([0-9.]* µs" "$OUT/bench.out" | tr '\n' ' '
echo "rcvbuf errors (host) $((rb1 - rb0))"
awk -F, -v c="$C" '/syscalls/ { split($3, a, "sys_enter_"); printf "  %s %.3f/msg", a[2], $1 / c } END { print "" }' "$OUT/perf.csv"
rm -rf "$OUT"
