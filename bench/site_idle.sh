#!/usr/bin/env bash
# Idle CPU of `shoal site` daemons (bench/RESULTS.md, "The idle ring"):
# one site of 3 daemons and one of 1 on loopback, no clients, for SECS
# seconds; prints each daemon's CPU time (user + system, from
# /proc/PID/stat, read just before the end) and its ring's token count,
# with the token hold on (the default) and off (`idle_rotations = 0`: the
# token circulates continuously, as before the hold). Uses the dev build
# of `shoal` (optimised in this workspace). Usage: bench/site_idle.sh [SECS]
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
cargo build -q -p shoal
BIN=$PWD/target/debug/shoal
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
python3 - "$BIN" "$DIR" "$SECS" <<'PY'
import os, socket, subprocess, sys, time
binary, d, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
tick = os.sysconf("SC_CLK_TCK")

def port():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick

for label, extra in [("hold (default)", ""), ("no hold (idle_rotations = 0)", "[engine.ring]\nidle_rotations = 0\n")]:
    ports = [port() for _ in range(4)]
    text = ('[[site]]\nname = "a"\ndaemons = [' +
            ", ".join(f'{{ id = {i}, addr = "127.0.0.1:{ports[i]}" }}' for i in range(3)) + ']\n\n' +
            f'[[site]]\nname = "b"\ndaemons = [{{ id = 3, addr = "127.0.0.1:{ports[3]}" }}]\n\n' +
            '[[link]]\na = "a"\nb = "b"\nweight = 1\n\n' + extra)
    path = os.path.join(d, "sites.toml")
    open(path, "w").write(text)
    procs = [subprocess.Popen([binary, "site", "--config", path, "--id", str(i), "--run-for", str(secs + 1)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for i in range(4)]
    time.sleep(1.0)
    start = [cpu(p.pid) for p in procs]
    time.sleep(secs - 0.5)
    used = [cpu(p.pid) - s for p, s in zip(procs, start)]
    outs = [p.communicate()[0] for p in procs]
    load = open("/proc/loadavg").read().split()[0]
    print(f"{label}: load {load}")
    for i, (u, o) in enumerate(zip(used, outs)):
        tokens = o.split("tokens ")[1].split(",")[0] if "tokens " in o else "?"
        print(f"  daemon {i}: {u:.2f} s CPU in {secs - 0.5:.1f} s ({100 * u / (secs - 0.5):.1f}% of a core), {tokens} tokens in its whole run")
PY
