#!/usr/bin/env bash
# Fault injection into real multi-process training (docs/reliability.md):
# co2-train (launcher + 2 worker processes, Fashion-MNIST) against 2 real
# co2-aggregator shard processes with checkpoints. One scenario per call:
#
#   shard_kill      kill -9 a shard at two random rounds; restart it on the
#                   same port from its --checkpoint_dir
#   shard_kill_mid_round
#                   the wide model (44-45 chunks per shard): kill -9 a shard
#                   while its round journal holds chunks of the open round
#                   it has stepped and sent; the restarted shard must
#                   restore them from the journal (twice, at random rounds)
#   worker_restart  kill -9 worker 1; the launcher (--max_restarts=1) restarts
#                   it and it rejoins the running job
#   node_restart    workers are nodes of 2 processes (--local_ranks=2):
#                   kill -9 worker 1's second process; the launcher
#                   (--max_restarts=1) restarts both of its processes and
#                   the node rejoins the running job
#   rank_shard_kill workers are nodes of 2 processes, each exchanging its
#                   own shard (rank slices): kill -9 shard 1, which only
#                   the nodes' local rank 1 talks to, at two random rounds
#                   and restart it; rank 1 reconnects alone, rank 0 never
#                   loses its stream
#   rank_link_cut   the same nodes; worker 1's local rank 1 alone loses its
#                   link to the shards (its process, put in a cgroup as it
#                   starts, before it opens a socket: a socket belongs to
#                   its creator's cgroup; the group's packets to the
#                   shards' ports are dropped) until the job went 6 rounds
#                   on without it, more than the shards replay:
#                   shard 1 closes rounds without it, it heals, and its
#                   node-mate rejoins with it, so that the node holds one
#                   round's model (needs root)
#   worker_stop     SIGSTOP worker 1 for five round deadlines, then SIGCONT;
#                   rounds close without it meanwhile, and it is too far
#                   behind to follow: it heals in its own process (or, if
#                   that fails, the launcher restarts it: --max_restarts=1)
#   worker_stop_heal
#                   the same without --max_restarts: worker 1 heals in its
#                   own process (co2-train --heal), fetching the shards'
#                   anchor and continuing at their round
#   link_cut        the workers run in a network namespace joined to the
#                   shards by a veth pair; the link goes down for longer than
#                   the keepalive (streams break) and comes back (needs
#                   root); a worker left behind heals, or is restarted
#   worker_kill_first_round, worker_kill_middle_round,
#   worker_kill_round_before_last, worker_kill_last_round
#                   a worker kills itself with SIGKILL at that exact round,
#                   after its inner steps and before its boundary
#                   (co2-train --inject_fault); the launcher restarts it
#   worker_kill_before_finish
#                   the same with its last Δ pushed, before Finish applies
#                   the last update: it rejoins once the others are finishing
#                   or gone
#   worker_kill_after_finish
#                   the same after Finish, before its report: it rejoins
#                   after the others left, with no round to compute
#   job_resume      every process of the job killed at once, at a random
#                   round: the launcher, the workers (kill -9) and both
#                   shards; the shards restart from their checkpoints and
#                   co2-train --resume continues from the workers'
#                   checkpoints (--checkpoint_dir, both runs); the final
#                   model must be bit-identical to the undisturbed run's
#   rank_job_resume the same with nodes of 2 processes exchanging rank
#                   slices: every local rank resumes from its own
#                   checkpoint of its slice
#   disk_full       960 steps (120 rounds); shard 0's --checkpoint_dir is a
#                   small tmpfs, filled up mid-job: the shard holds its
#                   updates, counts each failed
#                   write (co2_aggregator_checkpoint_failures_total, reason
#                   no_space, on its /metrics), logs one ERROR line for
#                   them, not one per retry, and the waiting workers print
#                   why ("update held: checkpoint failing: No space left on
#                   device"); once the filler is removed the job finishes
#                   with nothing lost (needs root to mount the tmpfs)
#   grow_shrink     4 workers, a longer run: the job starts with 2, grows to
#                   4 (co2-train --scale: workers 2 and 3 join the running
#                   job) and shrinks to 3 (worker 3 leaves on SIGTERM, its
#                   last Δ counted); the undisturbed run has 4 throughout
#   worker_outlier  4 workers; worker 2 multiplies its Δ by 10^6 in rounds
#                   4 and 5 (--inject_fault=2:scale_delta=4-5), then trains
#                   normally: the shards hold its contributions out of the
#                   mean (outlier rule, co2-train's default outlier_ratio),
#                   log and count it (rejected_chunks{reason="outlier"}),
#                   tell the worker, and keep it; accuracy within 0.01
#                   (both runs --deterministic)
#   worker_diverged 4 workers; worker 2 multiplies its Δ by 10^6 from round
#                   4 on: held out 3 rounds in a row (--max_rejected_chunks
#                   3) it is evicted, co2-train ends (the launcher reports
#                   worker 2 failed, evicted), and the shards' rounds went
#                   on without it
#
# SCENARIO runs co2-train's default, each worker applying the update a round
# owes between inner steps when it has arrived (docs/algorithm.md, "Applying
# an update when it arrives"); SCENARIO_boundary runs it with
# --apply=boundary in both runs, SCENARIO_by1 with --apply_by_step=1 (each
# worker waits for the update it owes after its round's first step).
#
# After each: training completes; every worker's final model hash equals the
# hash of the anchor in the shards' checkpoints (co2-checkpoint); every
# worker's rounds are contiguous up to the last (none for a worker restarted
# after the last round; a worker that healed skips to the round it names; a
# worker that left ends before the round its report names, with the anchor
# it left with) and the shards closed exactly that many; the final test accuracy is within
# TOLERANCE of an undisturbed run of the same job. Every wait is bounded (timeout). Exit 0: pass; 77:
# skipped (no root for link_cut or disk_full); else failure, with the logs
# kept.
#
# Usage: fault_training_test.sh BUILD_DIR SCENARIO [SEED]
set -euo pipefail

BUILD=$(cd "$1" && pwd)
SCENARIO=$2
APPLY=default
APPLY_FLAGS=()
case $SCENARIO in
  *_boundary) SCENARIO=${SCENARIO%_boundary}
              APPLY=boundary
              APPLY_FLAGS=(--apply=boundary) ;;
  *_by1) SCENARIO=${SCENARIO%_by1}
         APPLY=by1
         APPLY_FLAGS=(--apply_by_step=1) ;;
esac
SEED=${3:-$(( $(date +%s) % 100000 ))}
RANDOM=$SEED
TRAIN=$BUILD/bin/co2-train
AGGREGATOR=$BUILD/bin/co2-aggregator
CHECKPOINT=$BUILD/bin/co2-checkpoint
STEPS=240            # tau 8: 30 rounds, a few seconds undisturbed
TAU=8
ROUNDS=$(( (STEPS + TAU - 1) / TAU ))
ROUND_TIMEOUT=2s     # JobConfig round deadline (quorum close)
LEASE=20s            # longer than every pause below
TOLERANCE=0.05       # test accuracy, absolute
RUN_LIMIT=240        # seconds for one training run
MODEL=small          # shard_kill_mid_round: wide (several chunks per shard)
[[ $SCENARIO == shard_kill_mid_round ]] && MODEL=wide
NODE_ARGS=()         # two processes per worker, both runs
case $SCENARIO in
  node_restart | rank_shard_kill | rank_link_cut | rank_job_resume)
    NODE_ARGS=(--local_ranks=2) ;;
esac
[[ $SCENARIO == rank_job_resume ]] && SCENARIO=job_resume
WORKERS=2
RESUMABLE=""          # job_resume: worker checkpoints in both runs
[[ $SCENARIO == job_resume ]] && RESUMABLE=yes
METRICS_PORT=-1       # worker_outlier, disk_full: 0, a free port each shard logs
if [[ $SCENARIO == disk_full || $SCENARIO == rank_link_cut ]]; then
  # Long enough that the disk fills while rounds are left to hold, or that
  # the job outlasts the cut link.
  STEPS=960
  ROUNDS=$(( (STEPS + TAU - 1) / TAU ))
fi
[[ $SCENARIO == disk_full ]] && METRICS_PORT=0
[[ $SCENARIO == worker_outlier || $SCENARIO == worker_diverged ]] && WORKERS=4
if [[ $SCENARIO == worker_outlier ]]; then
  METRICS_PORT=0
  # Exact sums (applied at the boundary): the undisturbed run is a function
  # of its seed, so the tolerance measures what holding worker 2 out costs,
  # not when the updates of two runs happened to arrive (a point on this
  # short job).
  TOLERANCE=0.01
  APPLY=deterministic
  APPLY_FLAGS=(--deterministic)
fi
if [[ $SCENARIO == grow_shrink ]]; then
  # Long enough for the joining workers' processes to start (seconds) and
  # take part in many rounds.
  WORKERS=4
  STEPS=960
  ROUNDS=$(( (STEPS + TAU - 1) / TAU ))
fi

source "$(dirname "$0")/../scripts/netns_pair.sh"
WORK=$(mktemp -d /tmp/co2-fault-training.XXXXXX)
NETNS=co2fault$$
VETH=co2f$$
SUBNET=10.231.$(($$ % 250))  # per run: concurrent runs must not collide
declare -a SHARD_PID SHARD_PORT
SMALL_DISK=""        # disk_full: shard 0's checkpoint tmpfs, mounted
CUT_CGROUP=""        # rank_link_cut: the cgroup whose packets are dropped
CUT_RULE=()
HOST=127.0.0.1
IN_NS=()

log() { echo "[fault_training $SCENARIO apply=$APPLY] $*"; }

cleanup() {
  local status=$?
  for pid in "${SHARD_PID[@]:-}"; do
    if [[ -n $pid ]]; then
      kill "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  if [[ -n ${TRAIN_PID:-} ]]; then
    pkill -9 -P "$TRAIN_PID" 2>/dev/null || true  # the launcher under timeout
    kill -9 "$TRAIN_PID" 2>/dev/null || true
  fi
  if [[ -n ${FILLER_PID:-} ]]; then
    kill "$FILLER_PID" 2>/dev/null || true
    wait "$FILLER_PID" 2>/dev/null || true
  fi
  [[ -n $SMALL_DISK ]] && umount "$SMALL_DISK"
  if [[ -n $CUT_CGROUP ]]; then
    (( ${#CUT_RULE[@]} )) && iptables -D "${CUT_RULE[@]}" 2>/dev/null
    # Its processes go back to the root cgroup, which the kernel needs
    # before it removes the group.
    while read -r pid; do
      echo "$pid" >/sys/fs/cgroup/unified/cgroup.procs 2>/dev/null || true
    done <"$CUT_CGROUP/cgroup.procs" 2>/dev/null
    rmdir "$CUT_CGROUP" 2>/dev/null || true
  fi
  ip netns del "$NETNS" 2>/dev/null || true
  ip link del "${VETH}a" 2>/dev/null || true
  if [[ $status -eq 0 || $status -eq 77 ]]; then
    rm -rf "$WORK"
  else
    log "FAILED (seed $SEED); logs kept in $WORK"
  fi
}
trap cleanup EXIT

# To stderr: a fail inside $(...) (check) still reaches the log.
fail() { log "FAIL: $*" >&2; exit 1; }

# start_shard INDEX PORT: PORT 0 picks a free one (remembered for restarts).
start_shard() {
  local i=$1 port=$2
  mkdir -p "$WORK/ckpt$i"
  "$AGGREGATOR" --insecure --host=0.0.0.0 --port="$port" --shard_index="$i" \
    --num_shards=2 --checkpoint_dir="$WORK/ckpt$i" --metrics_port=$METRICS_PORT \
    --lease="$LEASE" >>"$WORK/shard$i.log" 2>&1 &
  SHARD_PID[$i]=$!
  local deadline=$((SECONDS + 20))
  until grep -q "listening on port" "$WORK/shard$i.log" 2>/dev/null &&
        [[ $(grep -c "listening on port" "$WORK/shard$i.log") -gt ${3:-0} ]]; do
    kill -0 "${SHARD_PID[$i]}" 2>/dev/null || fail "shard $i exited: $(tail -3 "$WORK/shard$i.log")"
    (( SECONDS < deadline )) || fail "shard $i did not start in 20 s"
    sleep 0.1
  done
  SHARD_PORT[$i]=$(grep -o 'listening on port [0-9]\+' "$WORK/shard$i.log" |
                   tail -1 | awk '{print $4}')
}

restart_shard() {
  local i=$1 starts
  starts=$(grep -c "listening on port" "$WORK/shard$i.log")
  start_shard "$i" "${SHARD_PORT[$i]}" "$starts"
}

# restored_round SHARD JOB: the round at which the shard's last start
# restored JOB from its checkpoint (rounds_closed); empty if that start did
# not restore it as an open job (it was finished, or not there).
restored_round() {
  local log=$WORK/shard$1.log
  # A start logs its restores before it listens: the last start's are the
  # lines between the last two "listening on port" lines.
  awk -v job="$2" '
    /listening on port/ { last = found; found = "" }
    $0 ~ ("restored job " job " at round ") {
      for (i = 1; i <= NF; ++i) if ($i == "round") found = $(i + 1)
    }
    END { print last }' "$log"
}

# kill_and_restart_shard SHARD WHICH: kill -9 the shard of job fault,
# restart it 1 s later from its checkpoint, and check that the kill landed
# in the running job, before its last round closed (else this was an
# undisturbed run).
kill_and_restart_shard() {
  local shard=$1 at
  log "kill -9 shard $shard ($2) after round $(current_round fault)"
  kill -9 "${SHARD_PID[$shard]}"
  wait "${SHARD_PID[$shard]}" 2>/dev/null || true
  sleep 1
  restart_shard "$shard"
  at=$(restored_round "$shard" fault)
  [[ -n $at ]] && (( at < ROUNDS )) ||
    fail "shard $shard did not restore job fault before its last round (restored at '${at}' of $ROUNDS rounds): training ended before the kill"
  log "shard $shard restarted from its checkpoint at round $at on port ${SHARD_PORT[$shard]}"
}

# kill_with_journal SHARD JOB: kill -9 the shard as soon as its round journal
# holds a chunk (stepped, synced, sent ahead of its round's close); false if
# training ended first. `[[ -s ]]` is a builtin: the poll forks nothing.
kill_with_journal() {
  local i=$1 journal="$WORK/ckpt$1/$2.shard-$1-of-2.ckpt.journal"
  local deadline=$((SECONDS + RUN_LIMIT))
  until [[ -s $journal ]]; do
    kill -0 "$TRAIN_PID" 2>/dev/null || return 1
    (( SECONDS < deadline )) || fail "shard $i's journal stayed empty for ${RUN_LIMIT} s"
    sleep 0.002
  done
  kill -9 "${SHARD_PID[$i]}"
  wait "${SHARD_PID[$i]}" 2>/dev/null || true
}

# The round worker 0 last finished (0 before the first).
current_round() {
  local p=$WORK/run-$1/progress.txt
  [[ -s $p ]] && tail -1 "$p" | awk '{print $1}' || echo 0
}

# wait_round JOB R: until worker 0 finished round R (or training ended).
wait_round() {
  local deadline=$((SECONDS + RUN_LIMIT))
  while (( $(current_round "$1") < $2 )); do
    kill -0 "$TRAIN_PID" 2>/dev/null || return 0
    (( SECONDS < deadline )) || fail "round $2 not reached in ${RUN_LIMIT} s"
    sleep 0.05
  done
}

# The pid of worker W's process of job JOB, local rank L (default 0; its
# command line names this test's run directory).
worker_pid() {
  pgrep -f -- "--role=worker --worker=$1 --local_rank=${3:-0} --run_dir=$WORK/run-$2 " || true
}

# start_training JOB [extra flags]: in the background; TRAIN_PID.
start_training() {
  local job=$1
  shift
  "${IN_NS[@]}" timeout -s KILL "$RUN_LIMIT" "$TRAIN" --task=fashion-mnist \
    --model=$MODEL --workers=$WORKERS --tau=$TAU --steps=$STEPS --threads=1 --seed=7 \
    --aggregators="$HOST:${SHARD_PORT[0]},$HOST:${SHARD_PORT[1]}" \
    --round_timeout=$ROUND_TIMEOUT --job="$job" --run_dir="$WORK/run-$job" \
    --keep_run_dir --progress=false --eval_every=0 --final_eval_examples=2000 \
    --report="$WORK/$job.json" "${APPLY_FLAGS[@]}" "${NODE_ARGS[@]}" \
    ${RESUMABLE:+--checkpoint_dir="$WORK/wck-$job"} "$@" \
    >>"$WORK/train-$job.out" 2>&1 &
  TRAIN_PID=$!
}

finish_training() {
  local job=$1 status=0
  wait "$TRAIN_PID" || status=$?
  TRAIN_PID=
  cat "$WORK/train-$job.out"
  [[ $status -eq 0 ]] || fail "co2-train ($job) exited with $status"
}

# check JOB: the model on every worker is the shards' anchor, rounds are
# contiguous; prints the final test accuracy.
check() {
  local job=$1 shards
  shards=$("$CHECKPOINT" "$WORK/ckpt0/$job.shard-0-of-2.ckpt" \
                         "$WORK/ckpt1/$job.shard-1-of-2.ckpt") ||
    fail "co2-checkpoint: $shards"
  python3 - "$WORK/run-$job" "$ROUNDS" "$shards" <<'EOF'
import glob, json, re, sys
run, rounds, shards = sys.argv[1], int(sys.argv[2]), sys.argv[3]
last = dict(re.findall(r"(\w+)=(\S+)", shards.splitlines()[-1]))
if int(last["rounds_closed"]) != rounds:
    sys.exit(f"shards closed {last['rounds_closed']} rounds, expected {rounds}")
for path in sorted(glob.glob(run + "/rank-*.json")):
    r = json.load(open(path))
    got = [x["round"] for x in r["rounds"]]
    # None: a worker restarted after the last round (it fetched the anchor).
    # A worker that healed continues at the round its report names (past
    # the last: the others ran the rest meanwhile, and it fetched the final
    # anchor); one that left ends before the round its report names.
    steps = [x.get("healed_to", x["round"] + 1) for x in r["rounds"][:-1]]
    end = r.get("left_at", rounds) - 1
    healed_past_end = bool(got) and r["rounds"][-1].get("healed_to", 0) > end
    if (got and got[-1] != end and not healed_past_end) or got[1:] != steps:
        sys.exit(f"{path}: rounds {got} are not contiguous up to {end}")
    if "left_at" in r:
        print(f"{path.split('/')[-1]}: rounds {got[0]}..{got[-1]}, then left "
              f"the job", file=sys.stderr)
        continue
    if r["final_hash"] != last["anchor_fnv1a"]:
        sys.exit(f"{path}: final model {r['final_hash']} differs from the "
                 f"shards' anchor {last['anchor_fnv1a']}")
    span = f"{got[0]}..{got[-1]}" if got else "none (rejoined after the last)"
    print(f"{path.split('/')[-1]}: rounds {span}, "
          f"model = shards' anchor {last['anchor_fnv1a']}", file=sys.stderr)
r0 = json.load(open(run + "/rank-0-0.json"))
print(r0["final_metrics"]["test_accuracy"])
EOF
}

# anchor_hash JOB: the fnv1a of the anchor in the shards' checkpoints.
anchor_hash() {
  "$CHECKPOINT" "$WORK/ckpt0/$1.shard-0-of-2.ckpt" \
                "$WORK/ckpt1/$1.shard-1-of-2.ckpt" |
    tail -1 | grep -o 'anchor_fnv1a=[0-9a-f]*'
}

# disk_full: shard 0 checkpoints to a 16 MiB tmpfs (each job's checkpoint
# takes 1 MiB, and a replaced one stays open for the updates it holds).
setup_small_disk() {
  mkdir -p "$WORK/ckpt0"
  if ! mount -t tmpfs -o size=16m tmpfs "$WORK/ckpt0"; then
    log "SKIP: cannot mount a tmpfs (needs root / CAP_SYS_ADMIN)"
    exit 77
  fi
  SMALL_DISK=$WORK/ckpt0
}

# no_space_failures: shard 0's co2_aggregator_checkpoint_failures_total
# {reason="no_space"}, read from its /metrics.
no_space_failures() {
  local port
  port=$(grep -o 'metrics on port [0-9]\+' "$WORK/shard0.log" | tail -1 | awk '{print $4}')
  python3 - "$port" <<'EOF'
import re, sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics",
                              timeout=10).read().decode()
m = re.search(r'^co2_aggregator_checkpoint_failures_total\{[^}]*reason="no_space"[^}]*\} (\S+)$',
              text, re.M)
if m is None:
    sys.exit('no co2_aggregator_checkpoint_failures_total{reason="no_space"} on /metrics')
print(int(float(m.group(1))))
EOF
}

# rank_link_cut: a cgroup (v2) for the process whose link is cut.
setup_cut_cgroup() {
  CUT_CGROUP=/sys/fs/cgroup/unified/co2cut$$
  if ! mkdir "$CUT_CGROUP" 2>/dev/null ||
     ! iptables -m cgroup --help >/dev/null 2>&1; then
    CUT_CGROUP=""
    log "SKIP: no cgroup2 at /sys/fs/cgroup/unified or no iptables cgroup match (needs root)"
    exit 77
  fi
}

# into_cut_cgroup W L JOB: worker W's local rank L into the cgroup as soon
# as it exists (it loads its data before it connects); prints its pid.
into_cut_cgroup() {
  local pid="" deadline=$((SECONDS + 30))
  until [[ -n $pid ]]; do
    (( SECONDS < deadline )) || fail "worker $1's local rank $2 did not start in 30 s"
    sleep 0.005
    pid=$(worker_pid "$1" "$3" "$2")
  done
  echo "$pid" >"$CUT_CGROUP/cgroup.procs"
  echo "$pid"
}

# cut_link: drop every packet the cgroup's sockets send to the shards' ports.
cut_link() {
  CUT_RULE=(OUTPUT -p tcp -m multiport
            --dports "${SHARD_PORT[0]},${SHARD_PORT[1]}"
            -m cgroup --path "${CUT_CGROUP#/sys/fs/cgroup/unified/}" -j DROP)
  iptables -I "${CUT_RULE[@]}"
}

restore_link() {
  iptables -D "${CUT_RULE[@]}"
  CUT_RULE=()
}

setup_netns() {
  if ! netns_pair "$NETNS" "$VETH" "$SUBNET"; then
    log "SKIP: 'ip netns add' failed (needs root / CAP_SYS_ADMIN)"
    exit 77
  fi
  HOST=$SUBNET.1
  IN_NS=(ip netns exec "$NETNS")
}

[[ -x $TRAIN && -x $AGGREGATOR && -x $CHECKPOINT ]] ||
  fail "build co2-train, co2-aggregator and co2-checkpoint in $BUILD first"
log "seed $SEED, work dir $WORK"
[[ $SCENARIO == link_cut ]] && setup_netns
[[ $SCENARIO == disk_full ]] && setup_small_disk
[[ $SCENARIO == rank_link_cut ]] && setup_cut_cgroup
start_shard 0 0
start_shard 1 0

# The undisturbed run, same job settings (another job name).
start_training base
finish_training base
BASE=$(check base)
log "undisturbed: test accuracy $BASE"

START=$SECONDS
case $SCENARIO in
  shard_kill | rank_shard_kill)
    start_training fault
    first=$((3 + RANDOM % 8))
    second=$((first + 6 + RANDOM % 8))
    for round in $first $second; do
      wait_round fault "$round"
      if [[ $SCENARIO == shard_kill ]]; then
        kill_and_restart_shard $((RANDOM % 2)) "a random shard"
      else
        kill_and_restart_shard 1 "local rank 1's"
      fi
    done
    finish_training fault
    grep -q "restored job fault" "$WORK/shard0.log" "$WORK/shard1.log" ||
      fail "no shard log says it restored the job"
    grep -q "reconnecting" "$WORK"/run-fault/rank-*.log ||
      fail "no worker log says it reconnected"
    if [[ $SCENARIO == rank_shard_kill ]]; then
      grep -q "exchange: every local rank its own shards' slice" "$WORK/train-fault.out" ||
        fail "the nodes did not exchange by rank slices"
      for w in 0 1; do
        grep -q "reconnecting" "$WORK/run-fault/rank-$w-1.log" ||
          fail "worker $w's local rank 1 did not reconnect to shard 1"
        ! grep -q "reconnecting" "$WORK/run-fault/rank-$w-0.log" ||
          fail "worker $w's local rank 0 reconnected, but it does not talk to shard 1: $(grep reconnecting "$WORK/run-fault/rank-$w-0.log" | head -1)"
      done
    fi
    ;;
  rank_link_cut)
    start_training fault
    victim=$(into_cut_cgroup 1 1 fault)
    grep -q "joined job fault" "$WORK/run-fault/rank-1-1.log" 2>/dev/null &&
      fail "worker 1's local rank 1 had joined before it was put in the cgroup"
    wait_round fault $((4 + RANDOM % 10))
    cut_at=$(current_round fault)
    log "worker 1's local rank 1 (pid $victim) cut off from the shards after round $cut_at"
    cut_link
    wait_round fault $((cut_at + 6))
    restore_link
    log "link back after round $(current_round fault)"
    finish_training fault
    grep -q "healed (" "$WORK/run-fault/rank-1-1.log" ||
      fail "worker 1's local rank 1 did not heal: $(grep -E 'stale|cannot follow|failed|behind' "$WORK/run-fault/rank-1-1.log" | tail -3)"
    grep -q "rejoins its shards: the node's ranks must hold one round's anchor"       "$WORK/run-fault/rank-1-0.log" ||
      fail "worker 1's local rank 0 did not rejoin with its node-mate"
    log "worker 1 rank 1: $(grep -o 'healed ([a-z]*) in [^:]*: continuing at round [0-9]*' "$WORK/run-fault/rank-1-1.log" | head -1)"
    grep -q "parameters identical on every rank after every boundary: yes" \
      "$WORK/train-fault.out" || fail "the node's ranks hold different models"
    ;;
  shard_kill_mid_round)
    # The journal is emptied by each round's checkpoint, so a kill can still
    # land after that checkpoint was renamed into place and before the
    # truncate: the restart then restores nothing. Up to five kills, until
    # two restarts restored journaled chunks.
    start_training fault
    restored=0
    for attempt in 1 2 3 4 5; do
      (( restored < 2 )) || break
      wait_round fault $(( $(current_round fault) + 2 + RANDOM % 4 ))
      shard=$((RANDOM % 2))
      kill_with_journal "$shard" fault || break
      log "kill -9 shard $shard with chunks in its journal, after round $(current_round fault)"
      before=$(grep -c "stepped and sent before the restart" "$WORK/shard$shard.log" || true)
      restart_shard "$shard"
      # The restore runs before the server listens: its log line is in.
      line=$(grep "stepped and sent before the restart" "$WORK/shard$shard.log" | tail -1)
      if (( $(grep -c "stepped and sent before the restart" "$WORK/shard$shard.log" || true) > before )); then
        restored=$((restored + 1))
        log "shard $shard ${line#*shard $shard }"
      else
        log "shard $shard restarted with an empty journal for its open round (killed after the round's checkpoint)"
      fi
    done
    finish_training fault
    (( restored >= 2 )) ||
      fail "only $restored of the restarts restored journaled chunks"
    grep -q "reconnecting" "$WORK"/run-fault/rank-*.log ||
      fail "no worker log says it reconnected"
    ;;
  worker_kill_*)
    # The victim dies at an exact point of its own run (no race with a
    # poll); worker 0 is the one whose report gives the final accuracy.
    case $SCENARIO in
      worker_kill_first_round) victim=1 fault=kill_in_round=0 ;;
      worker_kill_middle_round) victim=1 fault=kill_in_round=$((ROUNDS / 2)) ;;
      worker_kill_round_before_last) victim=1 fault=kill_in_round=$((ROUNDS - 2)) ;;
      # A deadline longer than the restart keeps the last round open until
      # the victim is back: it rejoins at the round after it and computes
      # nothing, the case where the last update is owed in Finish.
      worker_kill_last_round) victim=0 fault=kill_in_round=$((ROUNDS - 1)) deadline=60s ;;
      worker_kill_before_finish) victim=1 fault=kill_before_finish ;;
      worker_kill_after_finish) victim=0 fault=kill_after_finish ;;
      *) fail "unknown scenario '$SCENARIO'" ;;
    esac
    start_training fault --max_restarts=1 --inject_fault="$victim:$fault" \
      --round_timeout="${deadline:-$ROUND_TIMEOUT}"
    finish_training fault
    grep -q "inject_fault: SIGKILL" "$WORK/run-fault/rank-$victim-0.log" ||
      fail "worker $victim did not kill itself ($fault)"
    grep -q "restarting it" "$WORK/train-fault.out" || fail "the launcher did not restart worker $victim"
    log "worker $victim: $(grep -o 'starting at round [0-9]*' "$WORK/run-fault/rank-$victim-0.log" | tail -1) after $fault"
    ;;
  worker_restart)
    start_training fault --max_restarts=1
    wait_round fault $((4 + RANDOM % 10))
    victim=$(worker_pid 1 fault)
    [[ -n $victim ]] || fail "worker 1 not found"
    log "kill -9 worker 1 (pid $victim) after round $(current_round fault)"
    kill -9 "$victim"
    finish_training fault
    grep -q "restarting it" "$WORK/train-fault.out" || fail "the launcher did not restart worker 1"
    ;;
  node_restart)
    start_training fault --max_restarts=1
    wait_round fault $((4 + RANDOM % 10))
    victim=$(worker_pid 1 fault 1)
    [[ -n $victim ]] || fail "worker 1's local rank 1 not found"
    log "kill -9 worker 1 local rank 1 (pid $victim) after round $(current_round fault)"
    kill -9 "$victim"
    finish_training fault
    grep -q "worker 1 failed (local rank 1: .*); restarting it, all 2 local ranks" \
      "$WORK/train-fault.out" || fail "the launcher did not restart worker 1's node"
    [[ -s $WORK/run-fault/rank-1-1.json ]] || fail "worker 1's local rank 1 wrote no report"
    ;;
  worker_stop | worker_stop_heal)
    # Stopped for several deadlines, worker 1 falls behind what the shards
    # can replay, or its contribution is stale, when it resumes: it heals
    # in its own process, fetching the shards' anchor. worker_stop keeps a
    # restart to fall back on; worker_stop_heal has none and checks the heal.
    restarts=()
    [[ $SCENARIO == worker_stop ]] && restarts=(--max_restarts=1)
    start_training fault "${restarts[@]}"
    wait_round fault $((4 + RANDOM % 10))
    victim=$(worker_pid 1 fault)
    [[ -n $victim ]] || fail "worker 1 not found"
    before=$(current_round fault)
    log "SIGSTOP worker 1 (pid $victim) after round $before for 10 s (deadline $ROUND_TIMEOUT)"
    kill -STOP "$victim"
    sleep 10
    during=$(current_round fault)
    kill -CONT "$victim"
    log "SIGCONT; worker 0 went from round $before to $during meanwhile"
    (( during > before )) || fail "worker 0 stalled while worker 1 was stopped"
    finish_training fault
    if [[ $SCENARIO == worker_stop_heal ]]; then
      grep -q "healed (" "$WORK/run-fault/rank-1-0.log" ||
        fail "worker 1 did not heal: $(grep -E 'stale|cannot follow|failed' "$WORK/run-fault/rank-1-0.log" | tail -3)"
      log "worker 1: $(grep -o 'healed ([a-z]*) in [^:]*: continuing at round [0-9]*' "$WORK/run-fault/rank-1-0.log" | head -1)"
    fi
    ;;
  job_resume)
    start_training fault
    wait_round fault $((3 + RANDOM % 20))
    log "kill -9 co2-train, its workers and both shards after round $(current_round fault)"
    pkill -9 -f -- "--run_dir=$WORK/run-fault" || true
    kill -9 "${SHARD_PID[0]}" "${SHARD_PID[1]}"
    wait "$TRAIN_PID" "${SHARD_PID[0]}" "${SHARD_PID[1]}" 2>/dev/null || true
    restart_shard 0
    restart_shard 1
    log "shards restarted from their checkpoints; co2-train --resume"
    start_training fault --resume
    finish_training fault
    grep -q "resumed the job at round" "$WORK"/run-fault/rank-*.log ||
      fail "no worker log says it resumed"
    if (( ${#NODE_ARGS[@]} )); then
      for w in 0 1; do
        for l in 0 1; do
          [[ -s $WORK/wck-fault/worker-$w-rank-$l.pt ]] ||
            fail "no checkpoint of worker $w's local rank $l's slice"
          grep -q "resumed the job at round .*worker-$w-rank-$l.pt" \
            "$WORK/run-fault/rank-$w-$l.log" ||
            fail "worker $w's local rank $l did not resume from its own checkpoint"
        done
      done
    fi
    log "$(grep -ho 'resumed the job at round [0-9]*' "$WORK"/run-fault/rank-*.log | sort -u | tr '\n' ' ')"
    # The kill landed before the last round: the job resumed with rounds
    # left to train (else this was an undisturbed run).
    for at in $(grep -ho 'resumed the job at round [0-9]*' "$WORK"/run-fault/rank-*.log |
                awk '{print $NF}'); do
      (( at < ROUNDS )) ||
        fail "a worker resumed at round $at of $ROUNDS: training ended before the kill"
    done
    [[ $(anchor_hash base) == "$(anchor_hash fault)" ]] ||
      fail "the resumed job's final model differs from the undisturbed run's"
    ;;
  grow_shrink)
    start_training fault --scale=0:2,20:4,90:3
    finish_training fault
    grep -q "growing to 4 workers (workers 2 and 3 joining)" "$WORK/train-fault.out" ||
      fail "the launcher did not grow the job"
    grep -q "shrinking to 3 workers (worker 3 leaving" "$WORK/train-fault.out" ||
      fail "the launcher did not shrink the job"
    grep -q "left the job before round" "$WORK/run-fault/rank-3-0.log" ||
      fail "worker 3 did not leave the job: $(tail -3 "$WORK/run-fault/rank-3-0.log")"
    grep -q "worker worker-3 left" "$WORK/shard0.log" "$WORK/shard1.log" ||
      fail "no shard saw worker 3 leave"
    python3 - "$WORK/run-fault" "$ROUNDS" <<'EOF' || fail "the workers' rounds do not show the job growing and shrinking"
import json, sys
run, rounds = sys.argv[1], int(sys.argv[2])
first = {}
for w in range(4):
    r = json.load(open(f"{run}/rank-{w}-0.json"))
    first[w] = r["rounds"][0]["round"]
    print(f"worker {w}: rounds {first[w]}..{r['rounds'][-1]['round']}"
          + (f", left before round {r['left_at']}" if "left_at" in r else ""),
          file=sys.stderr)
    assert (w == 3) == ("left_at" in r), f"worker {w}: left_at"
assert first[0] == first[1] == 0, first
assert 20 <= first[2] < rounds and 20 <= first[3] < rounds, first
EOF
    ;;
  disk_full)
    start_training fault
    wait_round fault $((3 + RANDOM % 6))
    log "filling shard 0's checkpoint disk after round $(current_round fault)"
    # The space of a replaced checkpoint comes back when the shard closes
    # it, a round later: the filler takes it every 10 ms, until the shard
    # holds an update (then it frees nothing) and the disk is freed.
    touch "$WORK/filling"
    while [[ -e $WORK/filling ]]; do
      dd if=/dev/zero of="$SMALL_DISK/filler" bs=64k oflag=append \
        conv=notrunc 2>/dev/null || true
      sleep 0.01
    done &
    FILLER_PID=$!
    held="update held: checkpoint failing: No space left on device"
    # Held until the worker says why and the shard counted three retries
    # (one ERROR line must cover them all).
    deadline=$((SECONDS + 60))
    until grep -q "$held" "$WORK/run-fault/rank-0-0.log" 2>/dev/null &&
          (( $(no_space_failures) >= 3 )); do
      kill -0 "$TRAIN_PID" 2>/dev/null ||
        fail "training ended before the full disk held an update"
      (( SECONDS < deadline )) ||
        fail "in 60 s: worker 0 printed no '$held' or shard 0 counted fewer than 3 no_space failures ($(no_space_failures))"
      sleep 0.2
    done
    failures=$(no_space_failures)
    log "worker 0: $(grep -o "shard 0 .*$held" "$WORK/run-fault/rank-0-0.log" | head -1)"
    log "shard 0 counted $failures no_space failures; freeing the disk"
    rm "$WORK/filling"
    wait "$FILLER_PID"
    FILLER_PID=
    rm "$SMALL_DISK/filler"
    finish_training fault
    errors=$(grep -c "^E.*job fault: .* failed, update held:" "$WORK/shard0.log" || true)
    (( errors >= 1 && errors < failures )) ||
      fail "shard 0 logged $errors ERROR lines for $failures failed writes (one per minute expected)"
    grep -q "job fault: checkpoint writes succeed again after" "$WORK/shard0.log" ||
      fail "shard 0 did not log that its writes succeed again"
    grep -q "shard 0 (.*): no update held any more" "$WORK/run-fault/rank-0-0.log" ||
      fail "worker 0 did not print that the update is no longer held"
    ;;
  worker_outlier)
    start_training fault --inject_fault=2:scale_delta=4-5
    wait_round fault 8
    # Counted while the job is open (a finished job leaves the metrics).
    for i in 0 1; do
      port=$(grep -o 'metrics on port [0-9]*' "$WORK/shard$i.log" | awk '{print $4}')
      count=$(python3 -c 'import re, sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
print(sum(float(v) for v in re.findall(r"co2_aggregator_rejected_chunks_total\{[^}]*co2_job=\"fault\"[^}]*reason=\"outlier\"[^}]*\} (\S+)", text)))' \
        "http://127.0.0.1:$port/metrics") || fail "shard $i's /metrics: $count"
      python3 -c "import sys; sys.exit(not float('$count') >= 2)" ||
        fail "shard $i counts $count outlier chunks, expected one per round for rounds 4 and 5"
      log "shard $i: co2_aggregator_rejected_chunks_total{reason=\"outlier\"} = $count"
    done
    finish_training fault
    grep -q "inject_fault: the delta of rounds 4 to 5" "$WORK/run-fault/rank-2-0.log" ||
      fail "worker 2 did not scale its deltas"
    for round in 4 5; do
      for i in 0 1; do
        grep -q "contribution of worker worker-2 held out of the mean, round $round " "$WORK/shard$i.log" ||
          fail "shard $i did not hold worker 2's round $round out"
      done
      grep -q "held this worker's contribution to round $round .* out of the mean" "$WORK/run-fault/rank-2-0.log" ||
        fail "worker 2 was not told its round $round contribution was held out"
    done
    if grep -h "held out of the mean" "$WORK/shard0.log" "$WORK/shard1.log" |
         grep -v "worker worker-2 held out of the mean, round [45] "; then
      fail "the shards held out other contributions"
    fi
    ! grep -q "evicting worker" "$WORK/shard0.log" "$WORK/shard1.log" ||
      fail "a worker was evicted"
    log "$(grep -h 'held out of the mean' "$WORK/shard0.log" | head -1 | sed 's/.*job fault: //')"
    ;;
  worker_diverged)
    start_training fault --inject_fault=2:scale_delta=4-
    status=0
    wait "$TRAIN_PID" || status=$?
    TRAIN_PID=
    cat "$WORK/train-fault.out"
    (( status != 0 )) || fail "co2-train succeeded with worker 2 evicted"
    for i in 0 1; do
      grep -q "evicting worker worker-2: 3 rounds in a row with a contribution held out of the mean" "$WORK/shard$i.log" ||
        fail "shard $i did not evict worker 2: $(grep -h 'worker-2' "$WORK/shard$i.log" | tail -3)"
    done
    grep -q "evicted" "$WORK/run-fault/rank-2-0.log" ||
      fail "worker 2's log does not say it was evicted: $(tail -3 "$WORK/run-fault/rank-2-0.log")"
    grep -q "worker 2 local rank 0 failed" "$WORK/train-fault.out" ||
      fail "the launcher does not name worker 2"
    log "$(grep -h 'evicting worker' "$WORK/shard0.log" | head -1 | sed 's/.*job fault: //')"
    log "PASS"
    exit 0
    ;;
  link_cut)
    # A worker that misses more rounds than the shards can replay heals; one
    # whose streams stay down past --connect_timeout is restarted.
    start_training fault --max_restarts=2
    wait_round fault $((4 + RANDOM % 10))
    log "link down after round $(current_round fault) for 25 s (keepalive 10 + 10 s)"
    ip link set "${VETH}a" down
    sleep 25
    ip link set "${VETH}a" up
    log "link up"
    finish_training fault
    grep -q "reconnecting" "$WORK"/run-fault/rank-*.log ||
      fail "no worker log says its stream broke and reconnected"
    ;;
  *)
    fail "unknown scenario '$SCENARIO' (shard_kill | rank_shard_kill | rank_link_cut | shard_kill_mid_round | worker_restart | node_restart | worker_stop | worker_stop_heal | link_cut | disk_full | worker_kill_* | grow_shrink | job_resume | worker_outlier | worker_diverged)"
    ;;
esac
log "disturbed run took $((SECONDS - START)) s"
FAULT=$(check fault)
log "test accuracy: undisturbed $BASE, with $SCENARIO $FAULT"
# Informational: rounds closed at their deadline without a worker (a quorum
# close) change the bits, and the faults above may cause them.
if [[ $(anchor_hash base) == "$(anchor_hash fault)" ]]; then
  log "final model bit-identical to the undisturbed run's"
else
  log "final model differs from the undisturbed run's in its bits"
fi
python3 -c "import sys; sys.exit(abs($FAULT - $BASE) > $TOLERANCE)" ||
  fail "accuracy $FAULT is more than $TOLERANCE from the undisturbed $BASE"
log "PASS"
