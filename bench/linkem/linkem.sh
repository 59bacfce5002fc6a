# shellcheck shell=bash
# Delay and loss for bench/overlap/netns.sh's namespaces (sourced by it;
# needs root, iptables and the co2-linkem binary, OV_LINKEM, default
# build/bin/co2-linkem). Every host namespace (workers and the shards')
# sends its eth0 ingress through netfilter queue 0 to its own co2-linkem,
# which holds each packet for RTT/2 and drops LOSS of them. A packet crosses
# exactly one ingress, its receiver's, so any two hosts see RTT_MS and LOSS
# per direction. The delay is on ingress, not egress, because a packet held
# on its sender's egress still counts against the sending socket (TCP small
# queues), which would cap the rate at a few hundred KiB per round trip.

OV_LINKEM=${OV_LINKEM:-build/bin/co2-linkem}

ov_hosts() {
  local i
  for ((i = 0; i < $1; i++)); do echo "$OV_PREFIX-w$i"; done
  echo "$OV_PREFIX-agg"
}

# ov_delay WORKERS RTT_MS LOSS: the queue and its co2-linkem on every host
# (nothing when both are 0). Its stats go to OV_LINKEM_DIR (default
# /tmp) as linkem-<namespace>.json when ov_undelay stops it.
ov_delay() {
  local workers=$1 rtt=$2 loss=$3 ns seed=1
  if [ "$rtt" = 0 ] && [ "$loss" = 0 ]; then return 0; fi
  [ -x "$OV_LINKEM" ] || { echo "ov_delay: no co2-linkem at $OV_LINKEM" >&2; return 1; }
  for ns in $(ov_hosts "$workers"); do
    ip netns exec "$ns" "$OV_LINKEM" --queue=0 \
      --delay_ms="$(awk -v r="$rtt" 'BEGIN{print r / 2}')" --loss="$loss" \
      --seed=$((seed++)) --stats="${OV_LINKEM_DIR:-/tmp}/linkem-$ns.json" \
      2>"${OV_LINKEM_DIR:-/tmp}/linkem-$ns.log" &
  done
  # Each queue must be bound before packets are sent to it (the kernel
  # drops what an unbound queue gets).
  for ns in $(ov_hosts "$workers"); do
    ov_await_queue "$ns" || return 1
    ip netns exec "$ns" iptables -t mangle -A PREROUTING -i eth0 \
      -j NFQUEUE --queue-num 0
  done
}

# ov_await_queue NS: waits up to 5 s for NS's queue 0 to have a listener
# (/proc/net/netfilter/nfnetlink_queue lists bound queues); 1, with the
# emulator's log, if none came.
ov_await_queue() {
  local ns=$1 try
  for ((try = 0; try < 100; try++)); do
    if ip netns exec "$ns" awk '$1 == 0 {found = 1} END {exit !found}' \
      /proc/net/netfilter/nfnetlink_queue; then
      return 0
    fi
    sleep 0.05
  done
  echo "ov_delay: co2-linkem did not bind queue 0 in $ns:" >&2
  cat "${OV_LINKEM_DIR:-/tmp}/linkem-$ns.log" >&2
  return 1
}

# ov_undelay: removes the queue rules and stops every co2-linkem in this
# prefix's namespaces, started by this shell or another (they let held
# packets through and write their stats on the way out).
ov_undelay() {
  local pid ns
  for ns in $(ip netns list | awk '{print $1}' | grep "^$OV_PREFIX-"); do
    ip netns exec "$ns" iptables -t mangle -F PREROUTING 2>/dev/null || true
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = co2-linkem ] || continue
      kill -TERM "$pid" 2>/dev/null || true
      timeout 5 tail --pid="$pid" -f /dev/null || kill -KILL "$pid" 2>/dev/null || true
    done
  done
}

# ov_linkem_cpu: CPU seconds the emulators have used so far, summed.
ov_linkem_cpu() {
  local pid total=0 ticks
  for pid in $(pgrep -f "^$OV_LINKEM " || true); do
    ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)
    total=$((total + ticks))
  done
  awk -v t="$total" -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.2f", t / hz}'
}

# ov_host_tcp WORKERS default|tuned: every host's TCP settings (ov_ns_tcp).
ov_host_tcp() {
  local ns
  for ns in $(ov_hosts "$1"); do ov_ns_tcp "$ns" "$2" || return 1; done
}

# ov_ns_tcp NS default|tuned: one network namespace's TCP settings.
# default: Linux's (tcp_rmem/tcp_wmem maxima 6 / 4 MiB, slow start after
# idle). tuned: docs/operations.md's long-link settings, 64 MiB buffer
# maxima, no slow start after idle. The congestion control is the host's in
# both (a namespace may only pick one of tcp_allowed_congestion_control);
# ov_check_link records it.
ov_ns_tcp() {
  local ns=$1 profile=$2
  case $profile in
    default)
      ip netns exec "$ns" sysctl -qw net.ipv4.tcp_rmem="4096 131072 6291456" \
        net.ipv4.tcp_wmem="4096 16384 4194304" \
        net.ipv4.tcp_slow_start_after_idle=1 ;;
    tuned)
      ip netns exec "$ns" sysctl -qw net.ipv4.tcp_rmem="4096 131072 67108864" \
        net.ipv4.tcp_wmem="4096 16384 67108864" \
        net.ipv4.tcp_slow_start_after_idle=0 ;;
    *) echo "ov_ns_tcp: unknown profile '$profile' (default or tuned)" >&2
       return 1 ;;
  esac
}

# ov_await_port NS PORT: waits up to 5 s for a listener on TCP PORT in NS;
# 1, saying so, if none came.
ov_await_port() {
  local ns=$1 port=$2 try
  for ((try = 0; try < 100; try++)); do
    ip netns exec "$ns" ss -ltnH "sport = :$port" | grep -q . && return 0
    sleep 0.05
  done
  echo "ov_await_port: nothing listens on port $port in $ns" >&2
  return 1
}

# ov_check_link RATE RTT_MS LOSS HOSTS OUT: measures what worker 0's path
# to the shards' host gives: ping's user-to-user RTT (-U: the kernel's
# receive timestamp is taken before the ingress queue holds the packet),
# within 10 % of RTT_MS (0.5 ms when it is 0), and iperf3's rate for 6 s
# after 2 s of warm-up with the tuned buffers on both ends, within 10 % of
# RATE when LOSS is 0; both ends go back to HOSTS after. Writes what was
# asked and what was measured to OUT; returns 1, saying why, when either
# is off.
ov_check_link() {
  local rate=$1 rtt=$2 loss=$3 hosts=$4 out=$5
  local w0=$OV_PREFIX-w0 agg=$OV_PREFIX-agg ping_ms mbit cpu0 cpu1 t0 t1 ns server
  ping_ms=$(ip netns exec "$w0" ping -U -q -c 20 -i 0.05 -W 2 "$OV_AGG_ADDR" \
    | awk -F/ '/^rtt/{print $5}')
  for ns in "$w0" "$agg"; do ov_ns_tcp "$ns" tuned; done
  ip netns exec "$agg" iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
  server=$!
  ov_await_port "$agg" 5299
  cpu0=$(ov_linkem_cpu)
  t0=$(date +%s.%N)
  mbit=$(ip netns exec "$w0" iperf3 -c "$OV_AGG_ADDR" -p 5299 -t 6 -O 2 -J \
    | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e6, 1))')
  t1=$(date +%s.%N)
  cpu1=$(ov_linkem_cpu)
  wait "$server" 2>/dev/null || true
  for ns in "$w0" "$agg"; do ov_ns_tcp "$ns" "$hosts"; done
  python3 - "$(tc_rate_bits "$rate")" "$rtt" "$loss" "$hosts" "$ping_ms" "$mbit" \
    "$cpu0" "$cpu1" "$t0" "$t1" "$out" \
    "$(ip netns exec "$w0" cat /proc/sys/net/ipv4/tcp_congestion_control)" <<'PY'
import json, sys
rate_bits, rtt, loss, hosts, ping, mbit, cpu0, cpu1, t0, t1, out, cc = sys.argv[1:13]
rate_mbit = float(rate_bits) / 1e6
rtt, loss, ping, mbit = float(rtt), float(loss), float(ping), float(mbit)
link = {
    "asked": {"rate_mbit": rate_mbit, "rtt_ms": rtt, "loss": loss, "hosts": hosts},
    "measured": {"ping_rtt_ms": ping, "iperf3_mbit": mbit,
                 "iperf3_buffers": "64 MiB tcp_rmem/tcp_wmem maxima",
                 "congestion_control": cc,
                 "emulator_cpu_s_per_s": round((float(cpu1) - float(cpu0)) /
                                               (float(t1) - float(t0)), 3)},
}
json.dump(link, open(out, "w"), indent=1)
problems = []
if abs(ping - rtt) > max(0.1 * rtt, 0.5):
    problems.append(f"ping's RTT is {ping} ms, asked {rtt} ms")
if loss == 0 and mbit < 0.9 * rate_mbit:
    problems.append(f"iperf3 moved {mbit} Mbit/s, asked {rate_mbit}")
for p in problems:
    print(f"ov_check_link: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
}
