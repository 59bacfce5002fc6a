#!/bin/bash
# Chaos goodput benchmark (docs/reliability.md, "Goodput under chaos").
# co2-train (the launcher and its workers, Fashion-MNIST's CNN) runs in a
# network namespace joined to 2 co2-aggregator shard processes (with
# checkpoints) by one veth pair, twice with the same job: once undisturbed,
# once with a fault every 20-40 s, dealt from (each kind equally often)
#   worker_kill  kill -9 of a random worker (the launcher restarts it:
#                --max_restarts)
#   shard_kill   kill -9 of a random shard, restarted 1 s later from its
#                checkpoint
#   worker_stop  SIGSTOP of a random worker for 8 s, longer than its 4 s
#                lease, then SIGCONT (it heals)
#   link_cut     a random worker's link to the shards down for 12 s
#                (its packets to and from the shards dropped, past its
#                lease; it heals)
# and, in both runs, the job growing from 4 to 5 workers at a third of its
# rounds and shrinking back at two thirds (--scale). The undisturbed run
# takes about MINUTES; bench/chaos/analyze.py writes
# bench/results/chaos.json and prints goodput, time to heal, rounds closed
# at their deadline and final accuracy against the undisturbed run.
# Needs root, iproute2, iptables and the cgroup v2 hierarchy (a link cut
# drops the worker's packets by its sockets' ports and its cgroup).
#   sudo bench/chaos/run.sh [BUILD_DIR] [MINUTES] [SEED]   (default build 10 1)
# CO2_CHAOS_FAULTS="link_cut ..." draws from those kinds only;
# CO2_CHAOS_KEEP=1 keeps the logs and scrapes of a run that succeeded.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/scripts/netns_pair.sh"
build=$(cd "${1:-$root/build}" && pwd)
minutes=${2:-10}
seed=${3:-1}
RANDOM=$seed
train=$build/bin/co2-train
aggregator=$build/bin/co2-aggregator
[[ -x $train && -x $aggregator ]] || { echo "build co2-train and co2-aggregator in $build first" >&2; exit 1; }
[[ $(id -u) == 0 ]] || { echo "needs root (network namespaces)" >&2; exit 1; }

work=$(mktemp -d /tmp/co2-chaos.XXXXXX)
netns=co2chaos$$
cgroup2=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
[[ -n $cgroup2 ]] || { echo "no cgroup v2 hierarchy mounted (link cuts need it)" >&2; exit 1; }
command -v iptables >/dev/null || { echo "needs iptables (apt-get install iptables)" >&2; exit 1; }
cut_cgroup=$cgroup2/co2chaos$$
veth=co2x$$
subnet=10.233.$(($$ % 250))
host=$subnet.1
tau=16
workers=5
declare -a shard_pid shard_port
train_pid=

log() { echo "[chaos] $*" >&2; }
now() { date +%s.%N; }

cleanup() {
  local status=$?
  touch "$work/stop-scrape"
  [[ -n $train_pid ]] && kill -9 "$train_pid" 2>/dev/null || true
  pkill -9 -f -- "--run_dir=$work/" 2>/dev/null || true
  for pid in "${shard_pid[@]:-}"; do [[ -n $pid ]] && kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$netns" 2>/dev/null || true
  ip link del "${veth}a" 2>/dev/null || true
  rmdir "$cut_cgroup" 2>/dev/null || true
  if [[ $status -ne 0 ]]; then log "failed; logs kept in $work"
  elif [[ -n ${CO2_CHAOS_KEEP:-} ]]; then log "logs kept in $work"
  else rm -rf "$work"; fi
}
trap cleanup EXIT

netns_pair "$netns" "$veth" "$subnet" || { log "'ip netns add $netns' failed"; exit 1; }
mkdir "$cut_cgroup"

# start_shard I PORT: PORT 0 picks a free one, remembered for restarts.
start_shard() {
  local i=$1 port=$2 starts
  starts=$(grep -c "listening on port" "$work/shard$i.log" 2>/dev/null || true)
  mkdir -p "$work/ckpt$i"
  "$aggregator" --insecure --host=0.0.0.0 --port="$port" --shard_index="$i" \
    --num_shards=2 --checkpoint_dir="$work/ckpt$i" --lease=4s \
    --adaptive_round_deadline --round_deadline_floor=1s \
    --metrics_port=$((19460 + i)) \
    >>"$work/shard$i.log" 2>&1 &
  shard_pid[$i]=$!
  local deadline=$((SECONDS + 20))
  until (( $(grep -c "listening on port" "$work/shard$i.log" 2>/dev/null || true) > ${starts:-0} )); do
    (( SECONDS < deadline )) || { log "shard $i did not start"; exit 1; }
    sleep 0.1
  done
  shard_port[$i]=$(grep -o 'listening on port [0-9]*' "$work/shard$i.log" | tail -1 | awk '{print $4}')
}

# run JOB STEPS [flags...]: trains JOB in the namespace, in the background.
run() {
  local job=$1 steps=$2
  shift 2
  ip netns exec "$netns" timeout -s KILL $((minutes * 60 * 4 + 300)) "$train" \
    --task=fashion-mnist --workers=$workers --tau=$tau --steps="$steps" \
    --threads=1 --seed="$seed" --max_restarts=100 --round_timeout=3s \
    --metrics_port=19470 \
    --aggregators="$host:${shard_port[0]},$host:${shard_port[1]}" \
    --job="$job" --run_dir="$work/run-$job" --keep_run_dir --progress=false \
    --eval_every=0 --final_eval_examples=0 --report="$work/$job.json" "$@" \
    >"$work/train-$job.out" 2>&1 &
  train_pid=$!
}

# timeline JOB: until training ends, "time round" of worker 0 every 0.2 s.
timeline() {
  local p=$work/run-$1/progress.txt
  while kill -0 "$train_pid" 2>/dev/null; do
    [[ -s $p ]] && echo "$(now) $(tail -1 "$p" | awk '{print $1}')" >>"$work/timeline-$1.txt"
    sleep 0.2
  done
}

finish() {
  local status=0
  wait "$train_pid" || status=$?
  train_pid=
  [[ $status -eq 0 ]] || { tail -20 "$work/train-$1.out" >&2; log "co2-train ($1) exited with $status"; exit 1; }
}

start_shard 0 0
start_shard 1 0
/usr/bin/python3 "$here/scrape.py" "$work" 127.0.0.1:19460 127.0.0.1:19461 \
  $(for w in $(seq 0 $((workers - 1))); do echo "$subnet.2:$((19470 + w))"; done) &
scrape_pid=$!

# Steps for about MINUTES undisturbed, from a short probe of 4 workers
# (its rate over worker 0's training time).
probe_steps=$((tau * 30))
run probe $probe_steps --workers=4
finish probe
rate=$(/usr/bin/python3 -c "import json; r = json.load(open('$work/probe.json'))
print(round($probe_steps / r['ranks'][0]['train_s'], 1))")
steps=$(/usr/bin/python3 -c "s = int($rate * $minutes * 60); print(max($tau * 30, s - s % $tau))")
rounds=$((steps / tau))
scale="0:4,$((rounds / 3)):5,$((2 * rounds / 3)):4"
log "probe: $rate steps/s; $steps steps ($rounds rounds), --scale=$scale"

log "undisturbed run"
t_free=$(now)
run free "$steps" --scale="$scale"
timeline free &
timeline_pid=$!
finish free
wait "$timeline_pid"
log "undisturbed: $(( $(printf %.0f "$(now)") - $(printf %.0f "$t_free") )) s"

log "chaos run"
t_chaos=$(now)
run chaos "$steps" --scale="$scale"
timeline chaos &
timeline_pid=$!
read -ra kinds <<<"${CO2_CHAOS_FAULTS:-worker_kill shard_kill worker_stop link_cut}"
for kind in "${kinds[@]}"; do
  [[ $kind =~ ^(worker_kill|shard_kill|worker_stop|link_cut)$ ]] ||
    { log "CO2_CHAOS_FAULTS: unknown fault '$kind' (worker_kill, shard_kill, worker_stop, link_cut)"; exit 1; }
done
# next_kind: the next fault, dealt from the kinds shuffled afresh each time
# they run out, so that every kind comes equally often.
deck=()
next_kind() {
  local i j t
  if (( ${#deck[@]} == 0 )); then
    deck=("${kinds[@]}")
    for ((i = ${#deck[@]} - 1; i > 0; i--)); do
      j=$((RANDOM % (i + 1))); t=${deck[i]}; deck[i]=${deck[j]}; deck[j]=$t
    done
  fi
  kind=${deck[0]}
  deck=("${deck[@]:1}")
}
# A worker's first process (its leader), or nothing when it does not run.
leader_pid() { pgrep -f -- "--role=worker --worker=$1 --local_rank=0 --run_dir=$work/run-chaos " | head -1 || true; }
# cut_link PID / mend_link PID: drop, in the namespace, the packets between
# the shards and PID's open connections (by their ports) and any it opens
# meanwhile (by its cgroup, which new sockets take); then let them through.
cut_link() {
  local port
  echo "$1" >"$cut_cgroup/cgroup.procs"
  ip netns exec "$netns" iptables -A OUTPUT -d "$host" -m cgroup --path "${cut_cgroup#"$cgroup2"/}" -j DROP
  for port in $(ip netns exec "$netns" ss -tnpH state established dst "$host" |
                grep "pid=$1," | awk '{n = split($3, a, ":"); print a[n]}'); do
    ip netns exec "$netns" iptables -A OUTPUT -p tcp --sport "$port" -j DROP
    ip netns exec "$netns" iptables -A INPUT -p tcp --dport "$port" -j DROP
  done
}
mend_link() {
  ip netns exec "$netns" iptables -F OUTPUT
  ip netns exec "$netns" iptables -F INPUT
  echo "$1" >"$cgroup2/cgroup.procs" 2>/dev/null || true
}
while kill -0 "$train_pid" 2>/dev/null; do
  wait_until=$((SECONDS + 20 + RANDOM % 21))
  while (( SECONDS < wait_until )) && kill -0 "$train_pid" 2>/dev/null; do sleep 0.5; done
  kill -0 "$train_pid" 2>/dev/null || break
  next_kind
  case $kind in
    worker_kill | worker_stop | link_cut)
      w=$((RANDOM % 4)); pid=$(leader_pid "$w")
      [[ -n $pid ]] || continue
      t1=$(now)
      case $kind in
        worker_kill)
          kill -9 "$pid" 2>/dev/null || continue
          t2=$t1 ;;
        worker_stop)
          kill -STOP "$pid" 2>/dev/null || continue
          sleep 8
          kill -CONT "$pid" 2>/dev/null || true
          t2=$(now) ;;
        link_cut)
          cut_link "$pid"
          sleep 12
          mend_link "$pid"
          t2=$(now) ;;
      esac
      target=worker-$w ;;
    shard_kill)
      i=$((RANDOM % 2)); t1=$(now)
      kill -9 "${shard_pid[$i]}"; wait "${shard_pid[$i]}" 2>/dev/null || true
      sleep 1; start_shard "$i" "${shard_port[$i]}"; t2=$(now)
      target=shard-$i ;;
  esac
  log "$kind $target"
  echo "$t1 $t2 $kind $target" >>"$work/events.txt"
done
finish chaos
wait "$timeline_pid"
touch "$work/stop-scrape"
wait "$scrape_pid"
/usr/bin/python3 "$here/analyze.py" "$work" --minutes="$minutes" --seed="$seed" \
  --t_free="$t_free" --t_chaos="$t_chaos" --out="$root/bench/results/chaos.json"
