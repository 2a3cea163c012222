#!/usr/bin/env bash
# `shoal bench` across hosts: 3 daemons, each in a network namespace of its
# own on a bridge (netns.sh), and the bench's clients beside them.
#
#   tests/netns/bench.sh [ROUNDS]      default 3 rounds
#
# Each round runs, one after the other:
#   stream fifo    1 sender, 1 KB, one receiving client per host
#   stream agreed  the same, agreed
#   echo agreed    64 B, pinger on h1, ponger on h2, one round trip at a time
# and prints, at the end, the median of the rounds of each.
#
# The clients are threads of one `shoal bench` process connected to each
# host's daemon over that daemon's Unix socket (namespaces separate
# networks, not file systems): a client on host i talks only to the daemon
# on host i, as a local application would; the daemons talk to each other
# only across the bridge (10.77.0.1-3, 1,500-byte MTU, so the daemons'
# default 1,472-byte datagrams). One process holds every client, so that
# stream latencies are one-way on one clock.
#
# Environment:
#   SHOAL=path        the shoal binary (default target/release/shoal)
#   COUNT=N           stream messages per run (default 200000)
#   ECHOS=N           echo round trips per run (default 5000)
#   AUTH=1            [auth] on (a cluster key, datagrams sealed); default 0:
#                     insecure_no_auth, as Spread's and Corosync's runs
#                     beside it have no crypto
#   MULTICAST=1       pbcast's first phase by IP multicast on the bridge
#                     (default 0: unicast down the relay tree)
#   MTU=bytes         the links' MTU (default 1500) and MAX_DATAGRAM=bytes the
#                     daemons' `max_datagram` (default: theirs, 1,472 beyond
#                     loopback); e.g. MTU=9000 MAX_DATAGRAM=8972, jumbo frames
#   RUNS='...'        which runs each round makes (default "fifo agreed echo")
#   EXTRA='toml'      appended to every daemon's configuration, e.g.
#                     EXTRA=$'[cluster.vsync]\ngseq_window = 512'
#   OUT=file          append the CSV rows (`shoal bench --out`) to this
#                     file (default $TMPDIR/shoal-netns-bench-<pid>.csv);
#                     the medians go to OUT.summary as well
#
# Everything (namespaces, daemons, files but OUT) is removed on exit, on an
# error or Ctrl-C too. Run as root; exits 77 when namespaces are unusable.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
rounds=${1:-3}
shoal=${SHOAL:-$root/target/release/shoal}
count=${COUNT:-200000}
echos=${ECHOS:-5000}
auth=${AUTH:-0}
multicast=${MULTICAST:-0}
out=${OUT:-${TMPDIR:-/tmp}/shoal-netns-bench-$$.csv}
n=3

"$here/netns.sh" check
[ -x "$shoal" ] || { echo "bench: no $shoal (cargo build --release -p shoal, or set SHOAL)" >&2; exit 1; }

prefix="shoalt$$bench"
dir=$(mktemp -d "${TMPDIR:-/tmp}/shoal-netns-bench.XXXXXX")
cleanup() {
    local pids
    pids=$(jobs -p)
    if [ -n "$pids" ]; then
        kill $pids 2>/dev/null || true
        wait $pids 2>/dev/null || true
    fi
    "$here/netns.sh" down "$prefix"
    rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$here/netns.sh" reap
"$here/netns.sh" up "$prefix" "$n"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/cluster.key"
chmod 600 "$dir/cluster.key"

daemon_pids=()
for i in $(seq 1 $n); do
    peers=""
    for j in $(seq 1 $n); do
        [ "$j" = "$i" ] || peers="$peers\"10.77.0.$j:4804\", "
    done
    {
        echo "node = \"h$i\""
        echo "socket = \"$dir/h$i.sock\""
        echo "listen = \"10.77.0.$i:4804\""
        echo "peers = [${peers%, }]"
        if [ "$multicast" = 1 ]; then
            echo "multicast = \"239.255.77.1:9100\""
        fi
        if [ -n "${MAX_DATAGRAM:-}" ]; then
            echo "max_datagram = $MAX_DATAGRAM"
        fi
        if [ "$auth" != 1 ]; then
            echo "insecure_no_auth = true"
        fi
        if [ "$multicast" = 1 ]; then
            printf '\n[ip_multicast]\ninterface = "10.77.0.%s"\nttl = 1\n' "$i"
        fi
        if [ "$auth" = 1 ]; then
            printf '\n[auth]\nkey_file = "%s"\n' "$dir/cluster.key"
        fi
        if [ -n "${EXTRA:-}" ]; then
            printf '\n%s\n' "$EXTRA"
        fi
    } >"$dir/h$i.toml"
    # `ip netns exec` execs the daemon: $! is the daemon's pid.
    ip netns exec "$prefix-h$i" "$shoal" daemon --log error --config "$dir/h$i.toml" \
        >"$dir/h$i.log" 2>&1 &
    daemon_pids+=($!)
done
sockets="$dir/h1.sock,$dir/h2.sock,$dir/h3.sock"

# CPU seconds (user + system) the three daemons have used so far.
daemon_cpu() {
    local t=0 p
    for p in "${daemon_pids[@]}"; do
        t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
    done
    echo "scale=2; $t / $(getconf CLK_TCK)" | bc
}

# One `shoal bench` run (in h1's namespace: it opens no network socket,
# only the daemons' Unix sockets); prints its result line and the daemons'
# CPU time during it.
run() {
    local label=$1
    shift
    local c0 c1 line
    c0=$(daemon_cpu)
    line=$(ip netns exec "$prefix-h1" "$shoal" bench --sockets "$sockets" --out "$out" "$@" 2>&1 | grep -E '^(stream|echo):') || {
        echo "bench: $label failed" >&2
        return 1
    }
    c1=$(daemon_cpu)
    echo "$label | $line | daemons' cpu $(echo "$c1 - $c0" | bc) s"
    echo "$label $line" >>"$dir/lines"
}

setting="auth=$auth multicast=$multicast mtu=${MTU:-1500} max_datagram=${MAX_DATAGRAM:-default}${EXTRA:+ extra: $(echo "$EXTRA" | tr '\n' ' ')}"
echo "netns bench: $n daemons in $prefix-h1..$n, $setting, $rounds rounds, rows to $out"
runs=${RUNS:-fifo agreed echo}
for r in $(seq 1 "$rounds"); do
    for what in $runs; do
        case $what in
        fifo | agreed) run "r$r stream $what" --mode stream --service "$what" --size 1024 --count "$count" --senders 1 --clients 1 ;;
        echo) run "r$r echo agreed" --mode echo --service agreed --size 64 --count "$echos" ;;
        *) echo "bench: unknown run $what" >&2; exit 2 ;;
        esac
    done
done

# Medians over the rounds.
median() { sort -n | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
field() { # label, regex with one group
    grep "^r[0-9]* $1 " "$dir/lines" | sed -E "s|.*$2.*|\\1|" | median
}
{
    echo "medians of $rounds rounds (3 daemons in network namespaces, $setting):"
    for s in fifo agreed; do
        echo "  stream $s 1 KB 1 sender: $(field "stream $s" '= ([0-9]+) msgs/s') msgs/s per receiver, latency p50 $(field "stream $s" 'p50 ([0-9]+) ') us, p99 $(field "stream $s" 'p99 ([0-9]+) ') us"
    done
    echo "  echo agreed 64 B: p50 $(field "echo agreed" 'p50 ([0-9]+) ') us, p99 $(field "echo agreed" 'p99 ([0-9]+) ') us"
} | tee -a "$out.summary"
