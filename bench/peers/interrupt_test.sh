#!/bin/sh
# ctest peers_interrupt_test (label long): Ctrl-C to bench/peers/run.py
# while co2 trains (--quick's co2 row) stops the whole benchmark within a
# minute: the run it re-executes in its own session, that run's workers and
# shards, its network namespaces; the interrupted run leaves no record in
# the cache. Needs root (network namespaces); makes bench/peers/venv.sh's
# venv once.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: bench/peers needs root for network namespaces" >&2
  exit 77
fi
if pgrep -af "bench/peers/(run|worker).py" >&2; then
  echo "FAIL: a peers benchmark is running already (above)" >&2
  exit 1
fi
scratch=$(mktemp -d /tmp/co2-peers-interrupt.XXXXXX)
run=
# On any way out, what it started is stopped (run.py passes SIGTERM on).
trap 'st=$?; [ -z "$run" ] || kill -TERM "-$run" 2>/dev/null || true; rm -rf "$scratch"; exit $st' EXIT
# A process group of its own, as a terminal's foreground job is: Ctrl-C is
# SIGINT to the group.
row=tiny-100mbit-tau8-seed1-co2
setsid python3 "$here/run.py" --quick --only "$row" --cache "$scratch/cache" \
  --out "$scratch/peers_quick.json" >"$scratch/log" 2>&1 &
run=$!
# The venv may be built first (bench/peers/venv.sh, minutes when cold).
deadline=$(( $(date +%s) + 1500 ))
until pgrep -f "bench/peers/worker.py .*--job=$row" >/dev/null; do
  if ! kill -0 "$run" 2>/dev/null || [ "$(date +%s)" -gt "$deadline" ]; then
    echo "FAIL: no worker started; run.py's log ends:" >&2
    tail -20 "$scratch/log" >&2
    exit 1
  fi
  sleep 0.5
done
kill -INT "-$run"
deadline=$(( $(date +%s) + 60 ))
left() {
  pgrep -af "bench/peers/(run|worker).py|co2-aggregator" || true
  ip netns list | grep '^co2pr-' || true
}
while kill -0 "$run" 2>/dev/null || [ -n "$(left)" ]; do
  if [ "$(date +%s)" -gt "$deadline" ]; then
    echo "FAIL: 60 s after Ctrl-C, still running:" >&2
    left >&2
    exit 1
  fi
  sleep 0.5
done
status=0
wait "$run" || status=$?
if [ "$status" = 0 ]; then
  echo "FAIL: run.py exited 0 after Ctrl-C" >&2
  exit 1
fi
grep -q "stopped; the run in progress is not cached" "$scratch/log" || {
  echo "FAIL: run.py did not say it stopped; its log ends:" >&2
  tail -20 "$scratch/log" >&2
  exit 1
}
if ls "$scratch/cache/$row"-* >/dev/null 2>&1; then
  echo "FAIL: the interrupted run left a record:" >&2
  ls "$scratch/cache/$row"-* >&2
  exit 1
fi
echo "Ctrl-C stopped run.py (exit $status), its workers, shards and namespaces"
