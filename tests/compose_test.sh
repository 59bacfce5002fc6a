#!/usr/bin/env bash
# Brings up docker-compose.yml as a user would and trains through it
# (docs/operations.md, "Testing the deployment"):
#
#   docker-compose up -d aggregator-0 aggregator-1 trainer-0 trainer-1 prometheus
#
# with docker-compose against podman's Docker API socket: two shards, the
# job "compose" of two trainers, Prometheus built from Debian's package
# (Grafana, whose image cannot be had without a registry, is the one
# service left out). Checks:
#
# - mid-run, shard 1's process is killed (SIGKILL, as the OOM killer would);
#   the restart policy brings the container back, the shard restores the job
#   from the checkpoint in its volume, and the job goes on;
# - both trainers exit 0 without a restart; the test accuracy of the final
#   model (evaluated by worker 0, the same model on both) is >= MIN_ACC;
# - every trainer's final model hash equals the anchor in the shards'
#   checkpoints (co2-checkpoint, run from the image on the two volumes);
# - Prometheus scraped every target (up == 1 for all four) during the job;
#   every PromQL expression of deploy/grafana/co2-dashboard.json and every
#   alert rule of deploy/prometheus/alerts.yml evaluates without error, and
#   every dashboard panel has data during the job (tests/prometheus_check.py);
# - everything is torn down at the end, also on failure, within a bound.
#
# Every request goes to a container's own network namespace (nsenter -n with
# the host's curl and python3); Prometheus is published on a free loopback
# port only. The images are built with podman as in
# tests/container_image_test.sh (its layer cache: seconds after it).
#
# Usage: tests/compose_test.sh [SOURCE_DIR]     (ctest: label long)
#   CO2_KEEP_LOGS=1 keeps the logs of a passing run too.
#   CO2_SKIP_BUILD=1 runs the images already built (no podman build).
set -euo pipefail

SRC=$(cd "${1:-$(dirname "$0")/..}" && pwd)
LOG_NAME=compose_test
# shellcheck source=tests/container_lib.sh
source "$SRC/tests/container_lib.sh"

MIN_ACC=0.80
RUN_LIMIT=${CO2_COMPOSE_RUN_LIMIT:-1200}  # seconds for the job to finish
KILL_AT_ROUND=${CO2_COMPOSE_KILL_AT_ROUND:-60}  # shard 1 dies after it
PROJECT=co2compose$$
WORK=$(mktemp -d /tmp/co2-compose-test.XXXXXX)
SOCK=$WORK/podman.sock
SERVICES=(aggregator-0 aggregator-1 trainer-0 trainer-1 prometheus)
SERVICE_PID=

compose() {
  timeout "${COMPOSE_TIMEOUT:-300}" docker-compose -p "$PROJECT" \
    -f "$SRC/docker-compose.yml" "$@"
}

cleanup() {
  local status=$? ids
  trap - EXIT
  if [[ $status -ne 0 ]]; then
    local c name
    for c in $(timeout 30 podman ps -aq --filter \
                 "label=com.docker.compose.project=$PROJECT" 2>/dev/null); do
      name=$(timeout 30 podman inspect --format '{{.Name}}' "$c" 2>/dev/null) || continue
      timeout 30 podman logs "$c" >"$WORK/$name.log" 2>&1 || true
      echo "--- $name (last 20 lines)"
      tail -n 20 "$WORK/$name.log"
    done
  fi
  log "tearing down $PROJECT"
  local start=$SECONDS
  if [[ -S $SOCK ]]; then
    COMPOSE_TIMEOUT=180 compose down -v -t 5 >"$WORK/down.log" 2>&1 ||
      log "docker-compose down failed: $(tail -3 "$WORK/down.log")"
  fi
  # Whatever down left: containers, volumes and network by project label.
  ids=$(timeout 60 podman ps -aq \
          --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null) || true
  [[ -z $ids ]] || timeout 120 podman rm -f -t 2 $ids >/dev/null 2>&1 || true
  ids=$(timeout 60 podman volume ls -q \
          --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null) || true
  [[ -z $ids ]] || timeout 60 podman volume rm -f $ids >/dev/null 2>&1 || true
  timeout 60 podman network rm -f "${PROJECT}_co2" >/dev/null 2>&1 || true
  if [[ -n $SERVICE_PID ]]; then
    kill "$SERVICE_PID" 2>/dev/null || true
    wait "$SERVICE_PID" 2>/dev/null || true
  fi
  log "torn down in $((SECONDS - start)) s"
  if [[ $status -eq 0 && -z ${CO2_KEEP_LOGS:-} ]]; then
    rm -rf "$WORK"
  else
    [[ $status -eq 0 ]] || log "FAILED; logs kept in $WORK"
    rm -f "$SOCK"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 143' INT TERM

need_tools podman docker-compose curl nsenter /usr/bin/python3
[[ $(id -u) -eq 0 ]] || { log "SKIP: needs root (rootful podman)"; exit 77; }
podman_env "$WORK"

# podman's Docker-compatible API, for docker-compose; ends with the test.
# At low priority, like everything it starts: image builds and containers.
nice -n 15 podman --runtime="$RUNTIME" system service --time=0 "unix://$SOCK" \
  >"$WORK/podman-service.log" 2>&1 &
SERVICE_PID=$!
deadline=$((SECONDS + 30))
until curl -sf --max-time 2 --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1; do
  kill -0 "$SERVICE_PID" 2>/dev/null ||
    fail "podman system service exited: $(tail -3 "$WORK/podman-service.log")"
  (( SECONDS < deadline )) || fail "podman's API socket did not answer in 30 s"
  sleep 0.2
done
export DOCKER_HOST=unix://$SOCK
export CO2_PROMETHEUS_PORT=0  # a free loopback port: never collides

if [[ -n ${CO2_SKIP_BUILD:-} ]]; then
  build_seconds=0
  for image in "$CO2_IMAGE" "$PROMETHEUS_IMAGE"; do
    podman image exists "$image" || fail "CO2_SKIP_BUILD: no image $image"
  done
else
  # The images of the compose file's build: sections, with podman's own
  # build (the same as tests/container_image_test.sh, so its layer cache
  # makes this seconds): a `docker-compose build` through podman's API
  # builds into a cache of its own and recompiles everything (~25 min).
  ensure_base
  log "building the images (cached after tests/container_image_test.sh)"
  build_seconds=$(build_image "$CO2_IMAGE" "$SRC/deploy/docker/Dockerfile" "$SRC")
  build_seconds=$((build_seconds + $(build_image "$PROMETHEUS_IMAGE" \
    "$SRC/deploy/prometheus/Dockerfile" "$SRC/deploy/prometheus")))
  log "images ready in ${build_seconds} s"
fi

# --- up -------------------------------------------------------------------
up_start=$SECONDS
compose up -d --no-build "${SERVICES[@]}" >"$WORK/up.log" 2>&1 ||
  fail "docker-compose up failed: $(tail -5 "$WORK/up.log")"
log "docker-compose up -d: $((SECONDS - up_start)) s"
job_start=$up_start

cid() {  # the container of a service (docker-compose ps -q takes seconds)
  timeout 60 podman ps -aq --filter "label=com.docker.compose.project=$PROJECT" \
    --filter "label=com.docker.compose.service=$1"
}
state() { timeout 60 podman inspect --format "{{.State.$2}}" "$1"; }
# in_ns CONTAINER CMD...: CMD (from the host) in CONTAINER's network namespace.
in_ns() {
  local pid
  pid=$(state "$1" Pid) && [[ $pid -gt 0 ]] || return 1
  shift
  timeout 300 nsenter -t "$pid" -n "$@"
}
# metric CONTAINER PORT NAME: the sum of NAME's samples on that /metrics.
metric() {
  in_ns "$1" curl -sf --max-time 5 "http://127.0.0.1:$2/metrics" |
    awk -v n="$3" '$1 == n || index($1, n "{") == 1 {s += $NF; f = 1}
                   END {if (f) print s; else exit 1}'
}

declare -A C
for s in "${SERVICES[@]}"; do
  C[$s]=$(cid "$s")
  [[ -n ${C[$s]} ]] || fail "service $s has no container"
done

# --- kill shard 1 mid-run -------------------------------------------------
deadline=$((SECONDS + RUN_LIMIT))
until r=$(metric "${C[aggregator-1]}" 9464 co2_aggregator_rounds_completed_total \
            2>/dev/null) && (( ${r%.*} >= KILL_AT_ROUND )); do
  (( SECONDS < deadline )) ||
    fail "shard 1 did not complete $KILL_AT_ROUND rounds in $RUN_LIMIT s"
  [[ $(state "${C[trainer-0]}" Status) == running ]] ||
    fail "trainer-0 ended before round $KILL_AT_ROUND"
  sleep 0.5
done
old_pid=$(state "${C[aggregator-1]}" Pid)
kill -9 "$old_pid"
log "killed shard 1 (pid $old_pid) after round ${r%.*}, $((SECONDS - job_start)) s after up"
deadline=$((SECONDS + 120))
until [[ $(state "${C[aggregator-1]}" Status) == running &&
         $(state "${C[aggregator-1]}" Pid) != "$old_pid" ]] &&
      timeout 60 podman logs "${C[aggregator-1]}" 2>&1 | grep -q "restored job compose"; do
  (( SECONDS < deadline )) ||
    fail "shard 1 was not restarted from its checkpoint in 120 s: $(timeout 60 podman logs --tail 5 "${C[aggregator-1]}" 2>&1)"
  sleep 0.5
done
log "shard 1 restarted (restart policy) and $(timeout 60 podman logs "${C[aggregator-1]}" 2>&1 |
    grep -o 'restored job compose.*' | tail -1)"

# --- the job ends ---------------------------------------------------------
sample_time=
while :; do
  s0=$(state "${C[trainer-0]}" Status) s1=$(state "${C[trainer-1]}" Status)
  [[ $s0 == running && $s1 == running ]] || break
  sample_time=$(date +%s)  # the last moment both trainers still ran
  (( SECONDS < deadline + RUN_LIMIT )) || fail "the job did not end in $RUN_LIMIT s"
  sleep 1
done
deadline=$((SECONDS + 120))
for t in trainer-0 trainer-1; do
  until [[ $(state "${C[$t]}" Status) == exited ]]; do
    (( SECONDS < deadline )) || fail "$t still $(state "${C[$t]}" Status) 120 s after the other ended"
    sleep 1
  done
done
job_seconds=$((SECONDS - job_start))
log "both trainers exited, $job_seconds s after docker-compose up"
for t in trainer-0 trainer-1; do
  compose logs --no-color "$t" >"$WORK/$t.log" 2>&1 || true
done
for s in aggregator-0 aggregator-1 prometheus; do
  timeout 60 podman logs "${C[$s]}" >"$WORK/$s.log" 2>&1 || true
done

# Each trainer's rank report in the shared run volume: its final model hash;
# worker 0's leader also evaluates the final model (test accuracy).
run_vol=$(timeout 60 podman inspect --format '{{range .Mounts}}{{.Name}}{{end}}' "${C[trainer-0]}")
declare -A HASH
for i in 0 1; do
  t=trainer-$i
  code=$(state "${C[$t]}" ExitCode)
  restarts=$(timeout 60 podman inspect --format '{{.RestartCount}}' "${C[$t]}")
  [[ $code == 0 ]] || fail "$t exited with $code"
  [[ $restarts == 0 ]] || fail "$t was restarted $restarts time(s)"
  pm run --rm --network none -v "$run_vol:/r:ro" --entrypoint /bin/cat \
    "$CO2_IMAGE" "/r/rank-$i-0.json" >"$WORK/rank-$i-0.json" ||
    fail "$t left no report rank-$i-0.json in its run volume"
  read -r HASH[$t] acc < <(/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(r["final_hash"], r.get("final_metrics", {}).get("test_accuracy", "-"))
' "$WORK/rank-$i-0.json") || fail "$t: unreadable report"
  if [[ $i == 0 ]]; then
    /usr/bin/python3 -c "import sys; sys.exit(not float('$acc') >= $MIN_ACC)" ||
      fail "$t: test accuracy $acc < $MIN_ACC"
  fi
  [[ $i == 0 ]] && acc="test accuracy $acc" || acc="(worker 0 evaluates)"
  log "$t: exit 0, no restart, final model ${HASH[$t]}, $acc"
done

# --- the shards' checkpoints ----------------------------------------------
# As docs/operations.md tells a user (docker run; `docker-compose run` is
# refused by podman's API: "link is not supported").
vol0=$(timeout 60 podman inspect --format '{{range .Mounts}}{{.Name}}{{end}}' "${C[aggregator-0]}")
vol1=$(timeout 60 podman inspect --format '{{range .Mounts}}{{.Name}}{{end}}' "${C[aggregator-1]}")
shards=$(pm run --rm --network none -v "$vol0:/shard-0:ro" \
           -v "$vol1:/shard-1:ro" --entrypoint /usr/local/bin/co2-checkpoint \
           "$CO2_IMAGE" /shard-0/checkpoints/compose.shard-0-of-2.ckpt \
           /shard-1/checkpoints/compose.shard-1-of-2.ckpt 2>&1) ||
  fail "co2-checkpoint failed: $shards"
anchor=$(tail -1 <<<"$shards" | grep -o 'anchor_fnv1a=[0-9a-f]*' | cut -d= -f2)
[[ -n $anchor ]] || fail "co2-checkpoint printed no anchor hash: $shards"
for t in trainer-0 trainer-1; do
  [[ ${HASH[$t]} == "$anchor" ]] ||
    fail "$t's final model ${HASH[$t]} is not the shards' anchor $anchor"
done
log "shards' checkpoints: $(tail -1 <<<"$shards")"
log "both trainers' final models are the shards' anchor $anchor"

# --- Prometheus -----------------------------------------------------------
in_ns "${C[prometheus]}" /usr/bin/python3 \
  "$SRC/tests/prometheus_check.py" --url http://127.0.0.1:9090 \
  --time "$sample_time" --src "$SRC" --job compose ||
  fail "Prometheus checks failed"
log "PASS (images ${build_seconds} s, job ${job_seconds} s, total $SECONDS s before tear-down)"
