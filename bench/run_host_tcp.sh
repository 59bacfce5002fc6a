#!/bin/bash
# The measurements behind docs/operations.md's long-link host settings: one
# iperf3 stream from a worker's namespace to the shards' over an emulated
# path (bench/overlap/netns.sh's ov_link), 6 s after 2 s of warm-up, with
#   - Linux's socket buffer maxima against 64 MiB ones (1 Gbit/s, 100 ms);
#   - reno (loss-based, as cubic; a network namespace may only choose from
#     tcp_allowed_congestion_control) against BBR at 0.1 % loss
#     (100 Mbit/s and 1 Gbit/s, 100 ms).
# Writes bench/results/host_tcp.json. Needs root, iproute2, iptables, iperf3
# and a build with co2-linkem.
#   sudo bench/run_host_tcp.sh [BUILD_DIR]                 (~2 min)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
OV_PREFIX=co2ht
source "$here/overlap/netns.sh"
build=$(cd "${1:-build}" && pwd)
OV_LINKEM=$build/bin/co2-linkem
out=${OUT:-$here/results/host_tcp.json}
ov_session_up co2-host-tcp 1
OV_LINKEM_DIR=$OV_SCRATCH

# stream NAME [iperf3 flags...]: one stream's Mbit/s, as NAME in the report.
stream() {
  local name=$1 server
  shift
  ip netns exec "$OV_PREFIX-agg" iperf3 -s -1 -p 5298 >/dev/null 2>&1 &
  server=$!
  ov_await_port "$OV_PREFIX-agg" 5298
  ip netns exec "$OV_PREFIX-w0" iperf3 -c "$OV_AGG_ADDR" -p 5298 -t 6 -O 2 -J "$@" \
    >"$OV_SCRATCH/$name.json"
  wait "$server" || true
}

cell() {  # RATE RTT LOSS HOSTS: the link for the next streams
  ov_undelay
  ov_link 1 "$1" "$2" "$3" "$4" "$OV_SCRATCH/link-$1-$2-$3-$4.json"
}

cell 1gbit 100 0 default
stream buffers_default
cell 1gbit 100 0 tuned
stream buffers_64mib
for rate in 100mbit 1gbit; do
  cell "$rate" 100 0.001 tuned
  stream "loss_${rate}_reno" -C reno
  stream "loss_${rate}_bbr" -C bbr
done

python3 - "$OV_SCRATCH" "$out" "bench/run_host_tcp.sh${1:+ $1}" <<'PY'
import glob, json, os, sys
scratch, out, command = sys.argv[1:4]
streams = {}
for path in sorted(glob.glob(os.path.join(scratch, "*.json"))):
    name = os.path.basename(path)[:-5]
    if name.startswith("link-") or name.startswith("linkem-"):
        continue
    end = json.load(open(path))["end"]
    streams[name] = {
        "mbit": round(end["sum_received"]["bits_per_second"] / 1e6, 1),
        "retransmits": end["sum_sent"].get("retransmits"),
        "congestion_control": end.get("sender_tcp_congestion"),
    }
links = {os.path.basename(p)[5:-5]: json.load(open(p))
         for p in sorted(glob.glob(os.path.join(scratch, "link-*.json")))}
json.dump({"command": command, "streams": streams, "links": links},
          open(out, "w"), indent=1)
for name, s in streams.items():
    print(f"{name:22} {s['mbit']:7.1f} Mbit/s  {s['congestion_control']}, {s['retransmits']} retransmits")
print(f"wrote {out}", file=sys.stderr)
PY
