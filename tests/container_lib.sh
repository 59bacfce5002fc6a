# Shared by tests/container_image_test.sh and tests/compose_test.sh (sourced):
# podman with the OCI runtime that works on this host, the Debian base image
# built from Debian's packages when it is missing, and the image builds.
#
# Environment (all optional):
#   CO2_OCI_RUNTIME      OCI runtime for podman (default runc: crun fails on
#                        hosts with hybrid cgroups)
#   CO2_BUILD_JOBS       compiler processes in the image build (default 2)
#   CO2_BUILD_TIMEOUT    seconds one image build may take (default 3600)
#   CO2_IMAGE            the co2 image tag (default co2:latest, as in
#                        docker-compose.yml)

RUNTIME=${CO2_OCI_RUNTIME:-runc}
CO2_IMAGE=${CO2_IMAGE:-co2:latest}
PROMETHEUS_IMAGE=co2-prometheus:latest
BUILD_JOBS=${CO2_BUILD_JOBS:-2}
BUILD_TIMEOUT=${CO2_BUILD_TIMEOUT:-3600}

# podman_env DIR: a containers.conf in DIR, for every podman process of the
# test (CLI, API service, the clean-up processes conmon starts to apply
# restart policies): the OCI runtime, and ulimits a container can take.
# Rootful podman's defaults (nofile 1048576, nproc 4194304) are above the
# hard limits of a host that itself runs in a container, where runc then
# fails with "error setting rlimits". DIR must outlive the containers.
podman_env() {
  cat >"$1/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=16384:16384"]
[engine]
runtime = "$RUNTIME"
EOF
  export CONTAINERS_CONF=$1/containers.conf
}

log() { echo "[$LOG_NAME $(date -u +%H:%M:%S)] $*"; }
fail() { log "FAIL: $*" >&2; exit 1; }

# pm ARGS...: podman with the runtime, every call bounded by a deadline.
pm() { timeout 300 podman --runtime="$RUNTIME" "$@"; }

need_tools() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null ||
      fail "$t not found (make deps installs the packages the long tests need)"
  done
}

# ensure_base: debian:bookworm and debian:bookworm-slim, the bases the
# Dockerfiles name. Where no registry can be reached, mmdebstrap builds a
# minbase bookworm root file system from Debian's mirror (~80 s) and podman
# imports it under both tags.
ensure_base() {
  if ! podman image exists debian:bookworm; then
    need_tools mmdebstrap
    log "building debian:bookworm with mmdebstrap (minbase)"
    local tar
    tar=$(mktemp /tmp/co2-base.XXXXXX.tar)
    timeout 1200 mmdebstrap --quiet --variant=minbase bookworm "$tar" \
      "deb http://deb.debian.org/debian bookworm main" \
      "deb http://deb.debian.org/debian bookworm-updates main" \
      "deb http://deb.debian.org/debian-security bookworm-security main" ||
      { rm -f "$tar"; fail "mmdebstrap failed"; }
    pm import --change 'CMD ["bash"]' "$tar" debian:bookworm >/dev/null ||
      { rm -f "$tar"; fail "podman import failed"; }
    rm -f "$tar"
  fi
  podman image exists debian:bookworm-slim ||
    pm tag debian:bookworm debian:bookworm-slim
}

# build_image TAG DOCKERFILE CONTEXT: podman build at low priority (the
# build stage compiles LibTorch units for ~15-30 min on 2 cores when cold;
# podman's layer cache makes a rebuild after edits outside the sources a
# few seconds). Prints the seconds it took on stdout.
build_image() {
  local tag=$1 dockerfile=$2 context=$3 start=$SECONDS
  nice -n 15 timeout "$BUILD_TIMEOUT" podman --runtime="$RUNTIME" build \
    --build-arg BUILD_JOBS="$BUILD_JOBS" -f "$dockerfile" -t "$tag" \
    "$context" >&2 || fail "podman build of $dockerfile failed"
  echo $((SECONDS - start))
}
