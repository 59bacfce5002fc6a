#!/usr/bin/env bash
# Builds the co2 image from deploy/docker/Dockerfile with podman and checks
# what a user gets (docs/operations.md, "Testing the deployment"):
#
# - the base debian:bookworm(-slim) is built with mmdebstrap if it is missing
#   (no registry needed), then the image and the Prometheus image of
#   docker-compose.yml (deploy/prometheus/Dockerfile) are built;
# - co2-aggregator, co2-train, co2-checkpoint and co2-admin start (`--help`
#   exits 0 and lists the binary's own flags);
# - a shard runs as docker-compose.yml runs it (read-only root, no
#   capabilities, a volume at /var/lib/co2) as the unprivileged user 10001,
#   can write its checkpoint volume, and its /metrics serves from the first
#   second: co2_build_info, co2_aggregator_jobs and _workers at 0 and the
#   process_* metrics; a trainer that cannot reach its shards yet serves
#   co2_build_info and process_* too;
# - the runtime image holds no compiler, no headers and no -dev package;
# - prints the image sizes and the build time.
#
# Needs root podman, mmdebstrap (for the base), curl and nsenter on the host
# (make deps). /metrics is read with curl inside the container's own network
# namespace (nsenter -n): nothing is published on the host.
#
# Usage: tests/container_image_test.sh [SOURCE_DIR]     (ctest: label long)
set -euo pipefail

SRC=$(cd "${1:-$(dirname "$0")/..}" && pwd)
LOG_NAME=container_image_test
# shellcheck source=tests/container_lib.sh
source "$SRC/tests/container_lib.sh"

TAG=co2imgtest$$
VOLUME=$TAG-data
CONTAINERS=()
WORK=$(mktemp -d /tmp/co2-image-test.XXXXXX)

cleanup() {
  local status=$? c
  for c in "${CONTAINERS[@]:-}"; do
    [[ -n $c ]] && timeout 60 podman rm -f -t 2 "$c" >/dev/null 2>&1 || true
  done
  timeout 60 podman volume rm -f "$VOLUME" >/dev/null 2>&1 || true
  rm -rf "$WORK"
  [[ $status -eq 0 ]] || log "FAILED"
}
trap cleanup EXIT

need_tools podman curl nsenter
[[ $(id -u) -eq 0 ]] || { log "SKIP: needs root (rootful podman)"; exit 77; }
podman_env "$WORK"

ensure_base
log "building $CO2_IMAGE (deploy/docker/Dockerfile, $BUILD_JOBS jobs)"
build_seconds=$(build_image "$CO2_IMAGE" "$SRC/deploy/docker/Dockerfile" "$SRC")
log "built $CO2_IMAGE in ${build_seconds} s"
prom_seconds=$(build_image "$PROMETHEUS_IMAGE" \
  "$SRC/deploy/prometheus/Dockerfile" "$SRC/deploy/prometheus")
log "built $PROMETHEUS_IMAGE in ${prom_seconds} s"

# --- the binaries start ---------------------------------------------------
for bin in co2-aggregator co2-train co2-checkpoint co2-admin; do
  out=$(pm run --rm --entrypoint "/usr/local/bin/$bin" "$CO2_IMAGE" --help 2>&1) ||
    fail "$bin --help exited non-zero: $(tail -5 <<<"$out")"
  grep -q "$bin" <<<"$out" || fail "$bin --help printed no usage: $out"
  grep -q "No flags matched" <<<"$out" && fail "$bin --help lists none of its flags: $out"
  log "$bin --help: exit 0"
done
pm run --rm "$CO2_IMAGE" --help >/dev/null 2>&1 ||
  fail "the default entrypoint (co2-aggregator) does not start"

# --- no toolchain in the runtime image ------------------------------------
found=$(pm run --rm --entrypoint /bin/sh "$CO2_IMAGE" -c '
  for t in cc c++ gcc g++ cpp clang clang++ ld as make cmake; do
    command -v "$t"; done
  find /usr/include /usr/local/include -type f 2>/dev/null | head -5
  dpkg-query -W -f="\${Package}\n" | grep -E -- "-dev(:|$)|^(gcc|g\+\+|cpp|clang|binutils|build-essential)(-[0-9.]+)?$"
  true') || fail "could not inspect the image"
[[ -z $found ]] || fail "the runtime image holds build tools or headers:
$found"
log "runtime image: no compiler, no headers, no -dev package"

# --- a shard as docker-compose.yml runs it --------------------------------
metrics() {  # metrics CONTAINER PORT: its /metrics, read in its namespace
  local pid
  pid=$(timeout 60 podman inspect --format '{{.State.Pid}}' "$1") || return 1
  [[ $pid -gt 0 ]] || return 1
  nsenter -t "$pid" -n curl -sf --max-time 5 "http://127.0.0.1:$2/metrics"
}
wait_metrics() {  # wait_metrics CONTAINER PORT PATTERN: until it appears
  local deadline=$((SECONDS + 30)) out
  until out=$(metrics "$1" "$2" 2>/dev/null) && grep -q "$3" <<<"$out"; do
    (( SECONDS < deadline )) ||
      fail "$1: /metrics on $2 has no $3 after 30 s: $(timeout 60 podman logs "$1" 2>&1 | tail -5)"
    sleep 0.2
  done
  printf '%s\n' "$out"
}
SECURE=(--read-only --cap-drop ALL --security-opt no-new-privileges:true
        --tmpfs /tmp)

pm volume create "$VOLUME" >/dev/null
CONTAINERS+=("$TAG-shard")
pm run -d --name "$TAG-shard" "${SECURE[@]}" --network none \
  -v "$VOLUME:/var/lib/co2" "$CO2_IMAGE" --shard_index=0 --num_shards=1 \
  --port=50051 --metrics_port=9464 --checkpoint_dir=/var/lib/co2/checkpoints \
  --insecure >/dev/null
start=$SECONDS
shard_metrics=$(wait_metrics "$TAG-shard" 9464 '^co2_build_info')
log "shard /metrics answered $((SECONDS - start)) s after start"
for want in '^co2_build_info{.*program="co2-aggregator"' \
            '^co2_aggregator_jobs\({[^}]*}\)\? 0$' \
            '^co2_aggregator_workers\({[^}]*}\)\? 0$' \
            '^process_cpu_seconds_total ' '^process_resident_memory_bytes ' \
            '^process_open_fds ' '^process_max_fds ' \
            '^process_start_time_seconds '; do
  grep -q "$want" <<<"$shard_metrics" ||
    fail "idle shard's /metrics lacks $want:
$shard_metrics"
done
log "idle shard /metrics: build info, jobs/workers 0, process_*"

pid=$(timeout 60 podman inspect --format '{{.State.Pid}}' "$TAG-shard")
uids=$(awk '/^Uid:/ {print $2, $3, $4, $5}' "/proc/$pid/status")
[[ $uids == "10001 10001 10001 10001" ]] ||
  fail "the shard runs as uid $uids, not the unprivileged 10001"
capeff=$(awk '/^CapEff:/ {print $2}' "/proc/$pid/status")
[[ $capeff =~ ^0+$ ]] || fail "the shard has capabilities $capeff"
pm exec "$TAG-shard" sh -c 'mkdir -p /var/lib/co2/checkpoints &&
  touch /var/lib/co2/checkpoints/.w && rm /var/lib/co2/checkpoints/.w' ||
  fail "user co2 cannot write the checkpoint volume /var/lib/co2"
log "shard runs as uid 10001 without capabilities and writes its volume"

# --- a trainer before it reaches a shard ----------------------------------
CONTAINERS+=("$TAG-trainer")
pm run -d --name "$TAG-trainer" "${SECURE[@]}" --network none \
  --entrypoint /usr/local/bin/co2-train "$CO2_IMAGE" --role=worker \
  --worker=0 --workers=1 --task=fashion-mnist --job=imagetest \
  --aggregators=127.0.0.1:50051 --metrics_port=9465 --connect_timeout=60s \
  --run_dir=/tmp/run >/dev/null
trainer_metrics=$(wait_metrics "$TAG-trainer" 9465 '^co2_build_info')
for want in '^co2_build_info{.*program="co2-train"' \
            '^process_cpu_seconds_total ' '^process_resident_memory_bytes ' \
            '^process_open_fds ' '^process_start_time_seconds '; do
  grep -q "$want" <<<"$trainer_metrics" ||
    fail "waiting trainer's /metrics lacks $want:
$trainer_metrics"
done
log "waiting trainer /metrics: build info, process_*"

# --- sizes ----------------------------------------------------------------
size() { timeout 60 podman image inspect --format '{{.Size}}' "$1" |
           awk '{printf "%.0f MB", $1 / 1e6}'; }
log "image sizes: $CO2_IMAGE $(size "$CO2_IMAGE"), $PROMETHEUS_IMAGE" \
    "$(size "$PROMETHEUS_IMAGE"), debian:bookworm $(size debian:bookworm)"
log "PASS (image build ${build_seconds} s, total $SECONDS s)"
