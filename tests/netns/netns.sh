#!/usr/bin/env bash
# Hosts as network namespaces on one bridge, for Shoal's multi-host tests.
#
#   netns.sh check                 exit 0 if namespaces can be made here; else
#                                  print why and exit 77 (the "skipped" code)
#   netns.sh up PREFIX N           N hosts PREFIX-h1..N (10.77.0.i/24 and
#                                  fd77::i/64 on eth0) on a bridge in PREFIX-sw
#                                  (MTU=bytes in the environment: the links'
#                                  MTU, default 1500)
#   netns.sh down PREFIX           remove every namespace named PREFIX-*
#   netns.sh reap                  remove leftovers of dead test runs
#                                  (shoalt<pid>-* whose pid is gone)
#   netns.sh cut PREFIX I          unplug host I from the bridge (partition)
#   netns.sh heal PREFIX I         plug it back
#   netns.sh split PREFIX I...     move hosts I... to a second bridge (br1)
#                                  in the switch: two components that hear
#                                  nothing of each other, each still a LAN
#                                  (IP multicast included)
#   netns.sh unsplit PREFIX        move every host back onto br0
#   netns.sh demo [N]              N daemons (default 3) with [auth] and IP
#                                  multicast across the bridge; prints their
#                                  status, waits for Enter, removes everything
#
# Nothing is created in the root namespace: each host's veth is made inside
# the switch namespace with its peer placed directly in the host's
# namespace, so the machine's own interfaces, routes and firewall are never
# touched. Traffic stays on the bridge. Run as root.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
SUBNET=10.77.0

need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "netns: skipped: needs root (network namespaces)" >&2
        exit 77
    fi
}

check() {
    need_root
    if ! command -v ip >/dev/null; then
        echo "netns: skipped: no 'ip' command (iproute2)" >&2
        exit 77
    fi
    local probe="shoalprobe$$"
    if ! ip netns add "$probe" 2>/dev/null; then
        echo "netns: skipped: 'ip netns add' failed (no CAP_SYS_ADMIN, or no netns support)" >&2
        exit 77
    fi
    local ok=0
    ip -n "$probe" link add br0 type bridge 2>/dev/null &&
        ip -n "$probe" link add v0 type veth peer name v1 2>/dev/null || ok=1
    ip netns del "$probe"
    if [ $ok != 0 ]; then
        echo "netns: skipped: cannot create a bridge or veth pair in a namespace" >&2
        exit 77
    fi
}

up() {
    local prefix=$1 n=$2 sw="$1-sw"
    # Half a network is no use: remove it if any step fails.
    trap 'down "$prefix"' ERR
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    ip -n "$sw" link add br0 type bridge
    # No IGMP snooping: without a querier on the bridge, snooping could
    # stop forwarding a group once its membership times out.
    ip -n "$sw" link set br0 type bridge mcast_snooping 0
    ip -n "$sw" link set br0 up
    for i in $(seq 1 "$n"); do
        local host="$prefix-h$i"
        ip netns add "$host"
        ip -n "$host" link set lo up
        ip -n "$sw" link add "h$i" mtu "${MTU:-1500}" type veth peer name eth0 mtu "${MTU:-1500}" netns "$host"
        ip -n "$sw" link set "h$i" master br0 up
        ip -n "$host" addr add "$SUBNET.$i/24" dev eth0
        ip -n "$host" -6 addr add "fd77::$i/64" dev eth0 nodad
        ip -n "$host" link set eth0 up
    done
    trap - ERR
}

down() {
    local prefix=$1
    # Processes still running in a host namespace would keep nothing alive
    # but their sockets; deleting the name is what matters.
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^${prefix}-" || true); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
}

reap() {
    for ns in $(ip netns list | awk '{print $1}' | grep -E '^shoalt[0-9]+[a-z]*-' || true); do
        local pid=${ns#shoalt}
        pid=${pid%%[!0-9]*}
        if ! kill -0 "$pid" 2>/dev/null; then
            ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
            ip netns del "$ns" 2>/dev/null || true
        fi
    done
}

cut() { ip -n "$1-sw" link set "h$2" down; }
heal() { ip -n "$1-sw" link set "h$2" up; }

# A partition into two working components: the hosts named move to a
# second bridge. Each side stays a LAN of its own (ARP, IP multicast);
# nothing crosses between the bridges.
split() {
    local sw="$1-sw"
    shift
    if ! ip -n "$sw" link show br1 >/dev/null 2>&1; then
        ip -n "$sw" link add br1 type bridge
        ip -n "$sw" link set br1 type bridge mcast_snooping 0
        ip -n "$sw" link set br1 up
    fi
    local i
    for i in "$@"; do
        ip -n "$sw" link set "h$i" nomaster
        ip -n "$sw" link set "h$i" master br1 up
    done
}

# Heals a split: every port of br1 goes back to br0, and br1 is removed.
unsplit() {
    local sw="$1-sw" port
    ip -n "$sw" link show br1 >/dev/null 2>&1 || return 0
    for port in $(ip -n "$sw" -o link show master br1 | awk -F': ' '{split($2, name, "@"); print name[1]}'); do
        ip -n "$sw" link set "$port" nomaster
        ip -n "$sw" link set "$port" master br0 up
    done
    ip -n "$sw" link del br1
}

demo() {
    local n=${1:-3}
    check
    local shoal=${SHOAL:-$here/../../target/debug/shoal}
    [ -x "$shoal" ] || { echo "netns: build first (cargo build -p shoal) or set SHOAL" >&2; exit 1; }
    # Globals: the trap runs after this function has returned.
    prefix="shoalt$$demo"
    dir=$(mktemp -d /tmp/shoal-netns-demo.XXXXXX)
    trap 'kill $(jobs -p) 2>/dev/null; down "$prefix"; rm -rf "$dir"' EXIT
    trap 'exit 130' INT TERM
    up "$prefix" "$n"
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/cluster.key"
    chmod 600 "$dir/cluster.key"
    local i j peers
    for i in $(seq 1 "$n"); do
        peers=""
        for j in $(seq 1 "$n"); do
            [ "$j" = "$i" ] || peers="$peers\"$SUBNET.$j:4804\", "
        done
        cat >"$dir/h$i.toml" <<CONF
node = "h$i"
socket = "$dir/h$i.sock"
listen = "$SUBNET.$i:4804"
peers = [${peers%, }]
multicast = "239.255.77.1:9100"

[ip_multicast]
interface = "$SUBNET.$i"
ttl = 1

[auth]
key_file = "$dir/cluster.key"
CONF
        ip netns exec "$prefix-h$i" "$shoal" daemon --log warn --config "$dir/h$i.toml" &
    done
    sleep 4
    for i in $(seq 1 "$n"); do
        echo "== h$i"
        "$shoal" status --socket "$dir/h$i.sock" || true
    done
    echo "configs and sockets in $dir; press Enter to stop and remove the namespaces"
    read -r _ || true
}

cmd=${1:-}
shift || true
case "$cmd" in
    check) check ;;
    up) need_root; up "$@" ;;
    down) need_root; down "$@" ;;
    reap) need_root; reap ;;
    cut) need_root; cut "$@" ;;
    heal) need_root; heal "$@" ;;
    split) need_root; split "$@" ;;
    unsplit) need_root; unsplit "$@" ;;
    demo) demo "$@" ;;
    *) sed -n '2,27p' "$0"; exit 2 ;;
esac
